"""WebRTC links across the NAT testbed: direct where a NAT allows it, through coturn where
only TURN does, and a clear bounded failure where nothing does."""

from __future__ import annotations

import pytest

from tests.system.rtc_peer import run_pair

pytestmark = [pytest.mark.system, pytest.mark.slow]


def test_cone_nat_reaches_a_public_host_directly(natnet, tmp_path):
    pub, a = natnet.public_host(), natnet.behind(natnet.router("cone"))
    res = run_pair(a, pub, tmp_path, None, mb=1)
    assert res["ok"], res
    assert "relay" not in res["path"], res


def test_turn_carries_cone_to_symmetric(natnet, tmp_path):
    """Failed before: the relay candidate was paired with the other side's LAN address,
    coturn could not send there and dropped the whole allocation (see turn_cannot_reach)."""
    turn = natnet.start_turn()
    a = natnet.behind(natnet.router("cone"))
    b = natnet.behind(natnet.router("symmetric", symmetric=True))
    res = run_pair(a, b, tmp_path, turn.ice_servers(), mb=1)
    assert res["ok"], f"{res}\n{turn.log_text()[-3000:]}"
    assert "relay" in res["path"], res
    assert "wrote to peer -1" not in turn.log_text()


def test_symmetric_nat_without_turn_fails_within_the_timeout(natnet, tmp_path):
    a = natnet.behind(natnet.router("cone"))
    b = natnet.behind(natnet.router("symmetric", symmetric=True))
    res = run_pair(a, b, tmp_path, None, timeout=8)
    assert not res["ok"]
    assert "no connectivity within 8 s" in res["error"], res
    # it tried for the whole timeout, and gave up at its end (the connect's own bound; a
    # little more for closing ICE), not at the test's subprocess limit of 98 s
    assert 8 <= res["seconds"] < 8 + 3, res
