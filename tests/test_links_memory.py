"""The shared link machinery, exercised through the in-memory pair."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from identity.keys import PeerKey
from swarm import wire
from swarm.errors import LinkClosed, ProtocolError
from swarm.links import LinkOptions, memory_pair


@wire.message("test.blob")
class Blob(wire.Message):
    """A message carrying one array."""

    seq: int
    data: np.ndarray


A, B = PeerKey.generate(), PeerKey.generate()


async def test_messages_and_arrays_cross_in_order():
    a, b = memory_pair(A, B)
    assert (a.local, a.remote, b.local, b.remote) == (A.peer_id, B.peer_id, B.peer_id, A.peer_id)
    arrays = [np.random.default_rng(i).random((300, 300)) for i in range(3)]
    for i, arr in enumerate(arrays):
        await a.send(Blob(i, arr))
    for i, arr in enumerate(arrays):
        got = await asyncio.wait_for(b.recv(), 5)
        assert got.seq == i and np.array_equal(got.data, arr)
    st = a.stats()
    assert st.kind == "memory" and st.messages_sent == 3 and st.bytes_sent > 3 * 720_000
    await a.close()


async def test_ping_measures_rtt_and_stats_report_it():
    a, b = memory_pair(A, B)
    rtt = await a.ping()
    assert 0 < rtt < 1
    assert a.stats().rtt_ms == pytest.approx(rtt * 1e3)
    await a.close()


async def test_slow_receiver_slows_the_sender():
    opts = LinkOptions(recv_queue=2)
    a, b = memory_pair(A, B, opts, max_frames=4)
    sent = 0

    async def sender():
        nonlocal sent
        for i in range(100):
            await a.send(Blob(i, np.zeros(10)))
            sent += 1

    task = asyncio.create_task(sender())
    for _ in range(50):  # let the sender run as far as it can
        await asyncio.sleep(0)
    assert sent <= 2 + 4 + 2, "the sender ran ahead of a receiver that reads nothing"
    for i in range(100):
        assert (await asyncio.wait_for(b.recv(), 5)).seq == i
    await asyncio.wait_for(task, 5)
    await a.close()


async def test_close_says_goodbye_and_both_ends_report_it():
    a, b = memory_pair(A, B)
    await a.send(Blob(1, np.ones(3)))
    await a.close("shutting down")
    assert (await b.recv()).seq == 1  # what arrived before the close is still delivered
    with pytest.raises(LinkClosed, match="closed by peer: shutting down"):
        await asyncio.wait_for(b.recv(), 5)
    assert b.closed and a.closed
    with pytest.raises(LinkClosed):
        await a.send(Blob(2, np.ones(3)))
    closed = []
    b.add_close_callback(closed.append)
    assert closed == [b]


async def test_a_closed_link_raises_fresh_errors_and_keeps_no_callers_frames():
    """Raising the one stored LinkClosed grew its traceback by every failed caller's frames,
    which the link then kept alive (arrays and all)."""
    a, b = memory_pair(A, B)
    await b.close("bye")
    await asyncio.wait_for(a.wait_closed(), 5)
    raised = []
    for _ in range(3):
        with pytest.raises(LinkClosed) as info:
            await a.send(Blob(1, np.zeros(4)))
        raised.append(info.value)
    assert len({id(e) for e in raised}) == 3 and all(e.reason == a.close_reason for e in raised)
    assert a._closed is not None and a._closed.__traceback__ is None


async def test_protocol_error_closes_the_link_and_tells_the_peer():
    a, b = memory_pair(A, B)
    await a._send_frames([b"\x01\x01\xc1garbage"])  # a lying peer bypassing the encoder
    exc = await asyncio.wait_for(b.wait_closed(), 5)
    assert isinstance(exc.error, ProtocolError) and "malformed header" in exc.reason
    reason = (await asyncio.wait_for(a.wait_closed(), 5)).reason
    assert "closed by peer: protocol error" in reason


async def test_keepalive_timeout_closes_a_silent_link():
    opts = LinkOptions(keepalive_interval=0.05, keepalive_timeout=0.3)
    a, b = memory_pair(A, B, opts)
    b._tasks[1].cancel()  # b stops sending keepalives ...
    b._tasks[0].cancel()  # ... and stops reading (so it never answers pings)
    exc = await asyncio.wait_for(a.wait_closed(), 5)
    assert "keepalive timeout" in exc.reason
    assert a.stats().keepalives_lost >= 1


async def test_a_probe_closes_a_silent_link_long_before_the_keepalive_would():
    opts = LinkOptions(keepalive_interval=30, keepalive_timeout=60, probe_timeout=0.2)
    a, b = memory_pair(A, B, opts)
    for task in b._tasks:
        task.cancel()  # b hangs: its path went quiet (a NAT mapping gone), nothing breaks
    probes = [asyncio.create_task(a.probe()) for _ in range(3)]  # three overdue tasks ask
    assert await asyncio.wait_for(asyncio.gather(*probes), 5) == [False, False, False]
    exc = await asyncio.wait_for(a.wait_closed(), 5)
    assert exc.reason.startswith("silent: nothing heard") and "after a probe" in exc.reason
    assert await a.probe() is False  # a closed link is not probed again
    assert a.stats().messages_sent <= 2  # the three probes sent one ping (and no goodbye)


async def test_a_probe_of_a_live_peer_leaves_the_link_open():
    opts = LinkOptions(keepalive_interval=30, keepalive_timeout=60, probe_timeout=0.5)
    a, b = memory_pair(A, B, opts)
    assert await asyncio.wait_for(a.probe(), 5) is True
    assert not a.closed
    await a.send(Blob(1, np.zeros(3)))
    assert (await asyncio.wait_for(b.recv(), 5)).seq == 1
    await a.close()


async def test_keepalives_flow_and_rtt_is_measured():
    opts = LinkOptions(keepalive_interval=0.02)
    a, b = memory_pair(A, B, opts)

    async def first_pong():
        while a.stats().rtt_ms is None:
            await asyncio.sleep(0.02)

    await asyncio.wait_for(first_pong(), 5)
    assert a.stats().messages_received >= 1 and not a.closed
    await a.close()


async def test_a_sender_blocked_on_a_dead_peer_is_freed_by_the_keepalive_timeout():
    opts = LinkOptions(keepalive_interval=0.05, keepalive_timeout=0.3)
    a, b = memory_pair(A, B, opts, max_frames=2)
    for task in b._tasks:
        task.cancel()  # b hangs: reads nothing, says nothing
    sender = asyncio.create_task(a.send(Blob(0, np.zeros(2_000_000))))  # 16 MB: 62 frames
    exc = await asyncio.wait_for(a.wait_closed(), 5)
    assert "keepalive timeout" in exc.reason
    with pytest.raises(LinkClosed):
        await asyncio.wait_for(sender, 5)


async def test_a_message_left_half_sent_closes_the_link_after_the_frame_timeout():
    opts = LinkOptions(keepalive_interval=0.05, frame_timeout=0.3)
    a, b = memory_pair(A, B, opts)
    frames = wire.encode(Blob(1, np.zeros(100_000)), msg_id=999_999)  # header + 4 chunks
    await a._send_frames(frames[:2])  # header and one chunk, then only keepalives
    exc = await asyncio.wait_for(b.wait_closed(), 5)
    assert isinstance(exc.error, ProtocolError) and "stalled mid-message" in exc.reason


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 400_000), min_size=1, max_size=6))
def test_any_sequence_of_messages_arrives_intact_and_in_order(sizes):
    async def run():
        a, b = memory_pair(A, B, max_frames=3)
        sent = [Blob(i, np.arange(n, dtype=np.uint8)) for i, n in enumerate(sizes)]

        async def send():
            for msg in sent:
                await a.send(msg)

        task = asyncio.create_task(send())
        for msg in sent:
            got = await asyncio.wait_for(b.recv(), 5)
            assert got.seq == msg.seq and np.array_equal(got.data, msg.data)
        await task
        await a.close()

    asyncio.run(run())
