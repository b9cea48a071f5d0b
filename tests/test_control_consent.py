"""Consent: remembered per swarm only on "Always join"; no terminal -> refused naming --yes."""

from __future__ import annotations

import io
import stat

import pytest

from swarm.commands import consent
from swarm.errors import ConsentRefused

SWARM = bytes(20)
OTHER = bytes([1]) * 20


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_no_terminal_and_nothing_remembered_refuses_naming_yes(tmp_path):
    with pytest.raises(ConsentRefused, match="--yes"):
        consent.obtain(tmp_path, SWARM, "lab", stdin=io.StringIO("a\n"))


def test_yes_joins_once_without_remembering(tmp_path):
    assert consent.obtain(tmp_path, SWARM, "lab", yes=True) is consent.Decision.ONCE
    assert not consent.ConsentStore(tmp_path).remembered(SWARM)


def test_always_is_remembered_for_that_swarm_only(tmp_path):
    out = io.StringIO()
    assert consent.obtain(tmp_path, SWARM, "lab", stdin=Tty("a\n"), stdout=out) \
        is consent.Decision.ALWAYS
    assert "Always join" in out.getvalue()
    # Next time: no terminal needed for this swarm, still needed for another.
    assert consent.obtain(tmp_path, SWARM, "lab", stdin=io.StringIO()) is consent.Decision.ALWAYS
    with pytest.raises(ConsentRefused):
        consent.obtain(tmp_path, OTHER, "other", stdin=io.StringIO())
    assert stat.S_IMODE((tmp_path / consent.FILE).stat().st_mode) == 0o600
    consent.ConsentStore(tmp_path).forget(SWARM)
    assert not consent.ConsentStore(tmp_path).remembered(SWARM)


@pytest.mark.parametrize("answer", ["o\n", "once\n"])
def test_join_this_time_is_not_remembered(tmp_path, answer):
    assert consent.obtain(tmp_path, SWARM, "lab", stdin=Tty(answer), stdout=io.StringIO()) \
        is consent.Decision.ONCE
    assert not consent.ConsentStore(tmp_path).remembered(SWARM)


@pytest.mark.parametrize("answer", ["n\n", "\n", "", "maybe\n"])
def test_not_now_empty_eof_or_nonsense_refuses(tmp_path, answer):
    with pytest.raises(ConsentRefused, match="not joining"):
        consent.obtain(tmp_path, SWARM, "lab", stdin=Tty(answer), stdout=io.StringIO())
    assert not consent.ConsentStore(tmp_path).remembered(SWARM)


def test_corrupt_consent_file_is_ignored_not_trusted(tmp_path):
    (tmp_path / consent.FILE).write_text("{not json")
    with pytest.raises(ConsentRefused):
        consent.obtain(tmp_path, SWARM, "lab", stdin=io.StringIO())
