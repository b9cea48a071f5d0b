"""The sync core (sans-IO): followers read the DHT only when a heartbeat digest says their
copy differs, or when the coordinator falls silent (then with backoff); the coordinator and
passive clients read on fixed periods. Fed a fake clock; no sockets."""

from __future__ import annotations

import itertools
import random

import pytest

from identity.keys import PeerKey
from swarm.control.state import seal, unseal
from swarm.control.sync import Digest, Fetch, Mode, Sync, SyncTiming, view_digest
from swarm.errors import ProtocolError

T = SyncTiming(silence=2.0)
PEERS = [PeerKey.from_seed(bytes([i]) * 32).peer_id for i in range(1, 6)]
VIEW = view_digest(PEERS)


def run(sync: Sync, start: float, end: float, step: float = 0.1, heard: Digest | None = None,
        hb_every: float = 0.5) -> list[tuple[float, Fetch]]:
    """Tick from ``start`` to ``end``; heartbeats every ``hb_every`` s when ``heard`` is given;
    every fetch finishes at once (and a VIEW fetch brings the digest's view)."""
    started: list[tuple[float, Fetch]] = []
    now, next_hb = start, start
    while now < end:
        if heard is not None and now >= next_hb:
            sync.heard(heard, now)
            next_hb = now + hb_every
        for f in sync.due(now):
            started.append((now, f))
            if f is Fetch.VIEW and heard is not None:
                sync.have(view=heard.view)
            sync.done(f, now)
        now = round(now + step, 6)
    return started


def following(now: float = 0.0) -> Sync:
    s = Sync(now, T, rng=random.Random(1))
    s.have(view=VIEW, charter=3)
    s.heard(Digest(VIEW, len(PEERS), 3), now)
    return s


def test_view_digest_is_order_free_and_changes_with_the_set():
    assert view_digest(PEERS) == view_digest(reversed(PEERS))
    assert view_digest(PEERS) != view_digest(PEERS[:-1])


def test_unchanged_digest_means_no_fetch_beyond_the_safety_net():
    s = following()
    d = Digest(VIEW, len(PEERS), 3)
    started = run(s, 0.0, 20.0, heard=d)
    assert s.mode(20.0) is Mode.FOLLOWING
    assert started == []  # 20 s of heartbeats with nothing changed: no reads at all
    later = run(s, 20.0, 60.0, heard=d)
    # the jittered safety net: each kind at most once or twice in 60 s, never every second
    for kind in (Fetch.VIEW, Fetch.CHARTER, Fetch.STATE):
        assert 1 <= sum(1 for _, f in later if f is kind) <= 2


def test_changed_view_digest_means_one_fetch():
    s = following()
    new = view_digest(PEERS[:-1])
    s.heard(Digest(new, 4, 3), 1.0)
    assert s.due(1.0) == [Fetch.VIEW]
    s.have(view=new)
    s.done(Fetch.VIEW, 1.1)
    assert run(s, 1.1, 20.0, heard=Digest(new, 4, 3)) == []


def test_a_raised_charter_counter_means_one_charter_fetch():
    s = following()
    s.heard(Digest(VIEW, len(PEERS), 4), 1.0)
    assert s.due(1.0) == [Fetch.CHARTER]
    s.have(charter=4)
    s.done(Fetch.CHARTER, 1.2)
    assert s.due(2.0) == []


def test_a_digest_that_keeps_differing_backs_off():
    """The coordinator may lag behind the DHT: asking again every tick would be a flood."""
    s = following()
    other = view_digest(PEERS[:2])
    starts = []
    now = 0.0
    while now < 40.0:
        s.heard(Digest(other, 2, 3), now)
        for f in s.due(now):
            if f is Fetch.VIEW:
                starts.append(now)
            s.done(f, now)  # our view stays different
        now = round(now + 0.1, 6)
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert len(starts) <= 7 and gaps == sorted(gaps) and gaps[-1] >= 8


def test_coordinator_silence_falls_back_to_the_dht_with_backoff():
    s = following()
    assert run(s, 0.0, 1.9) == []  # still within the silence bound
    started = run(s, 2.0, 30.0)
    assert s.mode(30.0) is Mode.SILENT
    views = [t for t, f in started if f is Fetch.VIEW]
    states = [t for t, f in started if f is Fetch.STATE]
    assert views[0] == pytest.approx(2.0) and states[0] == pytest.approx(2.0)
    gaps = [b - a for a, b in zip(views, views[1:], strict=False)]
    assert gaps[0] < 1.5 and max(gaps) <= T.backoff_max * (1 + T.jitter) + 0.2
    assert 5 <= len(views) <= 9  # 1, 2, 4, 8, 8, ... (jittered), not one a second
    # heard again: back to quiet
    d = Digest(VIEW, len(PEERS), 3)
    s.heard(d, 30.0)
    assert run(s, 30.0, 45.0, heard=d) == []


def test_a_newcomer_reads_at_once_and_the_coordinator_on_its_periods():
    s = Sync(0.0, T, rng=random.Random(2))
    assert set(s.due(0.0)) == {Fetch.VIEW, Fetch.CHARTER, Fetch.STATE}
    c = Sync(0.0, T)
    c.role(True, 0.0)
    started = run(c, 0.0, 10.0)
    # an unchanged view: topic reads back off 1, 2, 4, 8 s (at 0, 1, 3, 7)
    assert [t for t, f in started if f is Fetch.VIEW] == [0.0, 1.0, 3.0, 7.0]
    assert sum(1 for _, f in started if f is Fetch.CHARTER) == 2
    assert sum(1 for _, f in started if f is Fetch.RIVALS) == 2
    assert not any(f is Fetch.STATE for _, f in started)


def test_a_passive_client_polls_on_fixed_periods():
    p = Sync(0.0, T, passive=True)
    started = run(p, 0.0, 5.0)
    assert sum(1 for _, f in started if f is Fetch.STATE) == 5
    assert p.mode(5.0) is Mode.PASSIVE


def test_a_fetch_in_flight_is_not_started_twice():
    s = Sync(0.0, T)
    assert Fetch.VIEW in s.due(0.0)
    assert Fetch.VIEW not in s.due(50.0)
    s.done(Fetch.VIEW, 50.0)


def test_digest_codec_and_its_signature():
    d = Digest(VIEW, 5, 7)
    assert Digest.decode(d.encode()) == d
    for bad in (b"", b"\x93\x01\x02\x03", bytes(100), Digest(b"x" * 3, 1, 1).encode()):
        with pytest.raises(ProtocolError):
            Digest.decode(bad)
    key = PeerKey.from_seed(b"k" * 32)
    sid = b"s" * 20
    msg = seal(key, sid, "hb", b"\x80", digest=d.encode())
    assert unseal(sid, msg).digest == d.encode()
    assert unseal(sid, seal(key, sid, "hb", b"\x80")).digest == b""
    # a digest swapped in by someone else breaks the signature
    import msgpack
    o = msgpack.unpackb(msg, raw=False)
    o["d"] = Digest(VIEW, 5, 8).encode()
    with pytest.raises(ProtocolError, match="signature"):
        unseal(sid, msgpack.packb(o, use_bin_type=True))
    o.pop("d")
    with pytest.raises(ProtocolError, match="signature"):
        unseal(sid, msgpack.packb(o, use_bin_type=True))


def test_a_coordinator_lists_every_second_while_its_view_changes_and_a_hello_brings_it_back():
    """Issue 19: every replica answers each topic read with the whole list, so an idle
    coordinator backs off to ``view_idle``; a change keeps it at ``view``, and a newcomer's
    hello brings the next read to within ``min_gap`` (a flood of hellos costs no more)."""
    c = Sync(0.0, T)
    c.role(True, 0.0)
    views = iter(view_digest(PEERS[:i]) for i in range(1, 100))
    reads: list[float] = []
    now = 0.0
    while now < 5.0:  # a member joins between every two reads
        for f in c.due(now):
            if f is Fetch.VIEW:
                reads.append(now)
                c.have(view=next(views))
            c.done(f, now)
        now = round(now + 0.1, 6)
    assert reads == [0.0, 1.0, 2.0, 3.0, 4.0]
    idle = run(c, 5.0, 40.0)
    times = [t for t, f in idle if f is Fetch.VIEW]
    gaps = [round(b - a, 6) for a, b in itertools.pairwise(times)]
    assert gaps == sorted(gaps) and gaps[-1] == T.view_idle and len(times) <= 8
    last = max(t for t, f in idle if f is Fetch.VIEW)
    for _ in range(100):  # hellos: the next read within min_gap of the last, once
        c.nudged(last + 0.2)
    assert [f for f in c.due(last + 0.5) if f is Fetch.VIEW] == []
    assert Fetch.VIEW in c.due(last + T.min_gap)


def test_only_a_coordinator_is_nudged():
    s = following()
    s.nudged(0.5)
    assert run(s, 0.5, 10.0, heard=Digest(VIEW, len(PEERS), 3)) == []


def test_rival_checks_read_the_members_round_robin_in_batches():
    """Issue 19: a coordinator's rival check reads ``rival_batch`` members' state items at
    a time (a lookup per member of a 1,000-member swarm every 5 s was ~8 MB/s), and every
    member is read once per sweep; a swarm no larger than a batch is read whole each time."""
    from swarm.control.sync import rival_batch

    peers = [PeerKey.from_seed(bytes([i % 251, i // 251]) * 16).peer_id for i in range(45)]
    assert rival_batch(peers[:20], None, 20) == sorted(peers[:20], key=lambda p: p.raw)
    seen, after = [], None
    for _ in range(3):  # ceil(45 / 20) checks sweep everyone
        batch = rival_batch(peers, after, 20)
        assert len(batch) == 20
        seen += batch
        after = batch[-1]
    assert set(seen) == set(peers)
    assert rival_batch(peers, after, 20)[0] == sorted(peers, key=lambda p: p.raw)[15]
    assert rival_batch([], None, 20) == []
