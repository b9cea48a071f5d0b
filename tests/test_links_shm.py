"""Shared-memory links between co-located peers (swarm.links.shm): used, zero-copy, proven,
bounded, and nothing left behind when either side is SIGKILLed."""

from __future__ import annotations

import asyncio
import mmap
import os
import signal

import msgpack
import numpy as np
import pytest

from identity.keys import PeerKey
from swarm import wire
from swarm.errors import LinkClosed, ProtocolError
from swarm.links import shm, tls
from swarm.links.echo import Bulk, Echo
from tests.links_helpers import echo_peer, memfds

A, B = PeerKey.generate(), PeerKey.generate()
BIG = np.arange(1 << 20, dtype=np.float32).reshape(1024, 1024)  # 4 MiB


def _base(arr: np.ndarray):
    while isinstance(arr, np.ndarray) and arr.base is not None:
        arr = arr.base
    return arr.obj if isinstance(arr, memoryview) else arr


async def _until(cond, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.01)


async def _pair():
    links: asyncio.Queue = asyncio.Queue()
    server = await tls.listen(A, on_link=links.put_nowait)
    dialer = await tls.connect(B, "127.0.0.1", server.port, expect=A.peer_id)
    listener = await asyncio.wait_for(links.get(), 5)
    return server, dialer, listener


async def test_colocated_peers_negotiate_shared_memory_and_receive_zero_copy():
    before = memfds()
    server, dialer, listener = await _pair()
    async with server:
        await dialer.send(Echo("to listener", [BIG]))
        got = await asyncio.wait_for(listener.recv(), 5)
        await listener.send(Echo("to dialer", [BIG * 2]))
        back = await asyncio.wait_for(dialer.recv(), 5)
        assert listener.shm is not None and dialer.shm is not None
        assert (dialer.shm.sent, listener.shm.received) == (1, 1)
        assert (listener.shm.sent, dialer.shm.received) == (1, 1)
        assert np.array_equal(got.arrays[0], BIG) and np.array_equal(back.arrays[0], BIG * 2)
        assert isinstance(_base(got.arrays[0]), mmap.mmap)  # a view of the mapping: no copy
        got.arrays[0][0, 0] = -1.0  # copy-on-write: the receiver may write its own view
        assert BIG[0, 0] == 0.0
        # the receivers said ShmDone: every sender descriptor is closed again, and once the
        # received arrays are dropped their mappings (and the memory) go too
        await _until(lambda: dialer.shm.waiting == 0 and listener.shm.waiting == 0)
        del got, back
        assert memfds() == before
        # small arrays still ride inline in the header
        await dialer.send(Echo("small", [np.ones(4, np.float32)]))
        await asyncio.wait_for(listener.recv(), 5)
        assert dialer.shm.sent == 1
        await dialer.close()
        await listener.wait_closed()


async def test_an_array_sent_to_several_colocated_peers_is_written_to_shared_memory_once():
    before, written = memfds(), shm.SEGMENTS.written
    links: asyncio.Queue = asyncio.Queue()
    server = await tls.listen(A, on_link=links.put_nowait)
    async with server:
        dialers = [await tls.connect(k, "127.0.0.1", server.port, expect=A.peer_id)
                   for k in (B, PeerKey.generate())]
        listeners = [await asyncio.wait_for(links.get(), 5) for _ in dialers]
        await _until(lambda: all(x.shm is not None for x in listeners))
        async with shm.SEGMENTS.prepared([BIG]):  # written here, off the loop, once
            assert shm.SEGMENTS.written == written + 1 and shm.SEGMENTS.held == 1
            await asyncio.gather(*(x.send(Echo("shared", [BIG])) for x in listeners))
        got = [await asyncio.wait_for(d.recv(), 5) for d in dialers]
        assert shm.SEGMENTS.written == written + 1 and shm.SEGMENTS.held == 0
        assert all(x.shm.sent == 1 for x in listeners) and all(d.shm.received == 1
                                                               for d in dialers)
        assert all(np.array_equal(g.arrays[0], BIG) for g in got)
        # each link held its own descriptor of the one segment until its peer mapped it
        await _until(lambda: all(x.shm.waiting == 0 for x in listeners))
        del got
        assert memfds() == before
        # outside a prepared block each link writes its own segment, as before
        await listeners[0].send(Echo("own", [BIG]))
        await asyncio.wait_for(dialers[0].recv(), 5)
        assert listeners[0].shm.sent == 2 and shm.SEGMENTS.written == written + 1
        for d in dialers:
            await d.close()


async def test_a_prepare_cancelled_midway_leaves_no_segment_behind():
    before = memfds()
    task = asyncio.ensure_future(_enter_and_wait(shm.SEGMENTS.prepared([BIG * 3])))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _until(lambda: shm.SEGMENTS.held == 0)
    assert memfds() == before


async def _enter_and_wait(block) -> None:
    async with block:
        await asyncio.Event().wait()


async def test_segments_mapped_while_a_release_is_being_sent_are_released_too():
    server, dialer, listener = await _pair()
    async with server:
        await listener._send_lock.acquire()  # the listener's line is busy (a result, say)
        try:
            await dialer.send(Echo("1", [BIG]))
            await asyncio.wait_for(listener.recv(), 5)  # mapped; its ShmDone waits
            await dialer.send(Echo("2", [BIG]))
            await asyncio.wait_for(listener.recv(), 5)  # mapped while that send waits
        finally:
            listener._send_lock.release()
        # nothing else arrives to flush it (the first keepalive comes after 5 s)
        await _until(lambda: dialer.shm.waiting == 0, timeout=3.0)
        await dialer.close()


async def test_switched_off_links_stay_on_tls(monkeypatch):
    monkeypatch.setenv(shm.ENV, "0")
    server, dialer, listener = await _pair()
    async with server:
        await dialer.send(Echo("x", [BIG]))
        got = await asyncio.wait_for(listener.recv(), 5)
        assert np.array_equal(got.arrays[0], BIG)
        assert dialer.shm is None and listener.shm is None
        await dialer.close()


def test_only_this_hosts_addresses_count_as_colocated():
    assert shm.colocated("127.0.0.1") and shm.colocated("::1") and shm.colocated("127.8.9.1")
    assert not shm.colocated("192.0.2.7")  # TEST-NET-1: never one of ours
    assert not shm.colocated("not an address")
    assert all(shm.colocated(a) for a in shm.local_addresses())


def _header_with_segment(segment: int, shape=(1024,)) -> bytes:
    meta = msgpack.packb([0, "uint8", list(shape), None, segment], use_bin_type=True)
    body = {"text": "x", "arrays": [msgpack.ExtType(wire.EXT_ARRAY, meta)]}
    return bytes((wire.PROTOCOL_VERSION, wire.KIND_HEADER)) + msgpack.packb(
        [1, Echo.TYPE, body], use_bin_type=True)


def test_a_segment_on_a_link_that_did_not_negotiate_it_is_refused():
    with pytest.raises(ProtocolError, match="did not negotiate"):
        wire.Decoder().feed(_header_with_segment(3))


def test_unsealed_wrong_size_or_missing_segments_are_refused():
    unsealed = os.memfd_create("swarm-shm")  # writable: could change after verification
    os.write(unsealed, bytes(1024))
    good = shm.Channel(os.getpid())
    sealed = shm.Channel(os.getpid()).spill(memoryview(bytes(1024)))
    try:
        for segment, shape, why in ((unsealed, (1024,), "not sealed"),
                                    (sealed, (2048,), "not a 2048-byte"),
                                    (999_999, (1024,), "descriptor 999999")):
            dec = wire.Decoder()
            dec.resolve = good.resolve
            with pytest.raises(ProtocolError, match=why):
                dec.feed(_header_with_segment(segment, shape))
        dec = wire.Decoder()
        dec.resolve = good.resolve
        (msg,) = dec.feed(_header_with_segment(sealed))
        assert msg.arrays[0].nbytes == 1024 and good.mapped == [sealed]
    finally:
        os.close(unsealed)
        os.close(sealed)


def test_a_receiver_that_never_releases_costs_the_sender_a_bounded_number_of_segments():
    channel = shm.Channel(os.getpid())
    data = memoryview(bytes(1 << 16))
    fds = [channel.spill(data) for _ in range(shm.MAX_OPEN + 5)]
    try:
        assert fds[-5:] == [None] * 5  # the rest goes over the link, with its flow control
        assert channel.waiting == shm.MAX_OPEN
        channel.done([12345678])  # numbers we never sent are ignored, never closed
        assert channel.waiting == shm.MAX_OPEN
    finally:
        channel.close()
    assert channel.waiting == 0


async def test_sigkill_of_the_receiver_releases_every_segment_of_the_sender():
    before = memfds()
    with echo_peer("tls") as (key, port, proc):
        link = await tls.connect(A, "127.0.0.1", port, expect=key.peer_id)
        await link.send(Echo("warm", [BIG]))
        back = await asyncio.wait_for(link.recv(), 10)
        assert link.shm is not None and link.shm.received == 1  # the echo came by shm too
        assert np.array_equal(back.arrays[0], BIG)
        os.kill(proc.pid, signal.SIGSTOP)  # it stops reading: no ShmDone comes back
        for _ in range(4):
            await link.send(Bulk(BIG))
        assert link.shm.waiting >= 4 and memfds() >= before + 4
        os.kill(proc.pid, signal.SIGKILL)
        await asyncio.wait_for(link.wait_closed(), 30)
        del back  # our own view of the echo (its mapping holds a descriptor while it lives)
        assert link.shm.waiting == 0 and memfds() == before
        with pytest.raises(LinkClosed):
            await link.send(Bulk(BIG))


async def test_sigkill_of_the_sender_leaves_the_receivers_arrays_intact_and_nothing_behind():
    shm_files = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    before = memfds()
    with echo_peer("tls") as (key, port, proc):
        link = await tls.connect(A, "127.0.0.1", port, expect=key.peer_id)
        await link.send(Echo("x", [BIG, BIG + 1]))
        back = await asyncio.wait_for(link.recv(), 10)
        assert link.shm is not None and link.shm.received == 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        await asyncio.wait_for(link.wait_closed(), 30)
        # our views outlive the sender (the kernel frees the memory once we drop them)
        assert np.array_equal(back.arrays[0], BIG) and np.array_equal(back.arrays[1], BIG + 1)
        del back
    assert memfds() == before
    if shm_files or os.path.isdir("/dev/shm"):
        assert set(os.listdir("/dev/shm")) <= shm_files  # nothing named, nothing to leak


@pytest.fixture
def netns():
    """A network namespace joined to ours by a veth pair: (namespace, its address)."""
    import secrets
    import shutil
    import subprocess

    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (CI has both)")
    tag = secrets.token_hex(3)
    ns, host_if, ns_if = f"swarm-shm-{tag}", f"vsh{tag}", f"vsn{tag}"
    octet = int(tag[:2], 16) % 250 + 1
    mine, theirs = f"10.213.{octet}.1", f"10.213.{octet}.2"

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)

    ip("netns", "add", ns)
    try:
        ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        ip("link", "set", ns_if, "netns", ns)
        ip("addr", "add", f"{mine}/30", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("-n", ns, "addr", "add", f"{theirs}/30", "dev", ns_if)
        ip("-n", ns, "link", "set", ns_if, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        yield ns, theirs
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


async def test_a_peer_in_another_network_namespace_gets_no_shared_memory(netns):
    """Same kernel, same /dev/shm, same user: only the address says it is another host, and
    that is what counts (a peer reached over the network is treated as remote)."""
    ns, address = netns
    with echo_peer("tls", "--host", address, prefix=("ip", "netns", "exec", ns)) as (
            key, port, _):
        link = await tls.connect(A, address, port, expect=key.peer_id)
        await link.send(Echo("x", [BIG]))
        back = await asyncio.wait_for(link.recv(), 10)
        assert np.array_equal(back.arrays[0], BIG)
        assert link.shm is None  # it came over TLS
        await link.close()


def test_whether_shared_memory_is_supported_is_asked_of_proc_once(monkeypatch):
    """It is asked on the event loop before every send: a stat of /proc lets go of the GIL,
    and getting it back from a busy thread cost up to 5 ms a call (0.26 s of the requester's
    loop in 64 inference calls)."""
    shm._platform.cache_clear()
    asked: list[str] = []
    real = os.path.isdir
    monkeypatch.setattr(shm.os.path, "isdir", lambda p: asked.append(p) or real(p))
    assert all(shm.supported() for _ in range(5))
    assert len(asked) == 1
    monkeypatch.setenv(shm.ENV, "0")
    assert not shm.supported()


def test_one_peer_process_with_many_links_gets_one_share_of_descriptors():
    """Issue 34: the per-link bound alone let one requester (many links, or many keys in
    one process) that never releases hold 64 of the worker's descriptors per link. Links to
    one peer process share MAX_OPEN_PER_PROCESS; the rest goes in-band."""
    limit = getattr(shm, "MAX_OPEN_PER_PROCESS", 2 * shm.MAX_OPEN)
    peer = 4_000_001                               # a pid no other test's links use
    channels = [shm.Channel(peer) for _ in range(6)]
    data = memoryview(bytes(1 << 16))
    try:
        for channel in channels:
            for _ in range(shm.MAX_OPEN):
                channel.spill(data)
        assert sum(c.waiting for c in channels) == limit
        other = shm.Channel(peer + 1)            # another process keeps its own share
        assert other.spill(data) is not None
        other.close()
        channels[0].close()                       # released: room again
        assert channels[2].spill(data) is not None
    finally:
        for channel in channels:
            channel.close()
    assert all(c.waiting == 0 for c in channels)


def test_populate_maps_a_received_segment_in_one_call():
    """A pass over a freshly mapped 16 MiB segment takes a page fault per 64 KiB (the
    kernel's fault-around); after ``populate`` it takes almost none, and the values are the
    sender's."""
    import resource

    data = np.arange(1 << 22, dtype=np.float32)  # 16 MiB
    fd = shm._sealed(memoryview(data).cast("B"))
    try:
        def faults_of_a_pass(populate: bool) -> int:
            arr = shm.map_array(os.getpid(), fd, data.nbytes).view(np.float32)
            if populate:
                shm.populate(arr)
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            total = float(arr.sum(dtype=np.float64))
            after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            assert total == float(data.sum(dtype=np.float64))
            return after - before

        assert faults_of_a_pass(False) > 200
        assert faults_of_a_pass(True) < 20
        shm.populate(data)  # not a mapping: nothing happens
    finally:
        os.close(fd)
