"""WebRTC links on loopback: signed signaling, tuning negotiation, refusals, two processes."""

from __future__ import annotations

import asyncio
import contextlib
import time

import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription

from identity.keys import PeerKey
from identity.replay import NonceWindow
from swarm import wire
from swarm.errors import AuthenticationError, ProtocolError
from swarm.links import LinkOptions, webrtc
from swarm.links.echo import Bulk, Echo, Flush, Flushed
from swarm.links.signaling import MAX_SKEW, Signal, SignedSignal, open_signal, seal
from tests.links_helpers import echo_peer

LOOPBACK = ["127.0.0.1"]


class Peer:
    """An endpoint on a UDP signaler, recording refusals and incoming links."""

    def __init__(self, key, signaler, **kw):
        self.key, self.signaler = key, signaler
        self.links: asyncio.Queue = asyncio.Queue()
        self.refused: asyncio.Queue = asyncio.Queue()
        self.endpoint = webrtc.WebRTCEndpoint(
            key, signaler, on_link=self.links.put_nowait, host_addresses=LOOPBACK,
            on_refused=lambda peer, exc: self.refused.put_nowait((peer, exc)), **kw)

    @property
    def addr(self):
        return ("127.0.0.1", self.signaler.port)


@pytest.fixture
async def make_peer():
    peers = []

    async def make(key=None, **kw):
        key = key or PeerKey.generate()
        peer = Peer(key, await webrtc.UDPSignaler.bind(key), **kw)
        peers.append(peer)
        return peer

    yield make
    for peer in peers:
        await peer.endpoint.close()
        peer.signaler.close()


@pytest.mark.parametrize(("offer_tuned", "answer_tuned"),
                         [(True, True), (False, False), (True, False), (False, True)])
async def test_link_round_trip_in_every_tuning_mode(make_peer, offer_tuned, answer_tuned):
    a, b = await make_peer(tuned=offer_tuned), await make_peer(tuned=answer_tuned)
    link = await a.endpoint.connect(b.key.peer_id, b.addr)
    other = await asyncio.wait_for(b.links.get(), 10)
    assert link.kind == other.kind == "webrtc"
    assert (link.remote, other.remote) == (b.key.peer_id, a.key.peer_id)
    assert link.tuned == other.tuned == (offer_tuned and answer_tuned)
    arr = np.random.default_rng(0).random((600, 600))  # 2.9 MB: 11 chunk frames
    await link.send(Echo("out", [arr]))
    got = await asyncio.wait_for(other.recv(), 10)
    assert got.text == "out" and np.array_equal(got.arrays[0], arr)
    await other.send(Echo("back", [arr[:3]]))
    assert np.array_equal((await asyncio.wait_for(link.recv(), 10)).arrays[0], arr[:3])
    assert 0 < await link.ping() < 1
    await link.close("done")
    exc = await asyncio.wait_for(other.wait_closed(), 10)
    assert "done" in exc.reason or "connection lost" in exc.reason


async def test_a_forged_offer_is_refused_and_the_endpoint_carries_on(make_peer):
    a, b, mallory = await make_peer(), await make_peer(), await make_peer()
    fake = Signal("offer", a.key.peer_id, b.key.peer_id, b"s" * 16, b"n" * 16, time.time(),
                  "v=0\r\na=fingerprint:sha-256 AA:BB\r\n", "sha-256 AA:BB", {})
    (body,) = wire.encode(fake, msg_id=0)
    (forged,) = wire.encode(SignedSignal(body, mallory.key.sign(body)), msg_id=0)
    await mallory.signaler.send(b.key.peer_id, b.addr, forged)
    peer, exc = await asyncio.wait_for(b.refused.get(), 10)
    assert isinstance(exc, AuthenticationError) and "bad signature" in str(exc)
    link = await a.endpoint.connect(b.key.peer_id, b.addr)  # b still serves honest peers
    assert (await asyncio.wait_for(b.links.get(), 10)).remote == a.key.peer_id
    await link.close()


async def test_a_replayed_offer_is_refused(make_peer):
    a, b = await make_peer(), await make_peer()
    sent = []
    original = a.signaler.send

    async def recording_send(to, addr, payload):
        sent.append(payload)
        await original(to, addr, payload)

    a.signaler.send = recording_send
    link = await a.endpoint.connect(b.key.peer_id, b.addr)
    await asyncio.wait_for(b.links.get(), 10)
    await original(b.key.peer_id, b.addr, sent[0])  # an eavesdropper plays it again
    _, exc = await asyncio.wait_for(b.refused.get(), 10)
    assert "replayed" in str(exc)
    assert b.links.empty()
    await link.close()


async def test_a_blocked_peer_gets_no_answer(make_peer):
    a = await make_peer(connect_timeout=1.0)
    b = await make_peer(accept=lambda peer: peer != a.key.peer_id)
    with pytest.raises(TimeoutError, match="no answer"):
        await a.endpoint.connect(b.key.peer_id, b.addr)
    peer, exc = await asyncio.wait_for(b.refused.get(), 10)
    assert peer == a.key.peer_id and "blocked" in str(exc)


async def _fingerprint_lines(sdp: str) -> list[str]:
    return [line for line in sdp.splitlines() if line.startswith("a=fingerprint:")]


async def test_a_dtls_certificate_other_than_the_signed_one_is_refused(make_peer):
    """Mallory signs an offer naming somebody else's certificate, then does DTLS with hers."""
    b, mallory = await make_peer(), await make_peer()
    real, other = RTCPeerConnection(), RTCPeerConnection()
    try:
        for pc in (real, other):
            pc.createDataChannel("swarm")
        await webrtc._gather_on(real, LOOPBACK)
        await real.setLocalDescription(await real.createOffer())
        await other.setLocalDescription(await other.createOffer())
        mine = await _fingerprint_lines(real.localDescription.sdp)
        theirs = await _fingerprint_lines(other.localDescription.sdp)
        sdp = real.localDescription.sdp
        for m, t in zip(mine, theirs, strict=True):
            sdp = sdp.replace(m, t)
        offer = mallory.endpoint._signal("offer", b.key.peer_id, b"s" * 16, sdp, {})
        answers: asyncio.Queue = asyncio.Queue()
        mallory.signaler.on_message(lambda s, addr, data: answers.put_nowait(data))
        mallory.endpoint._closed = True  # mallory handles the answer herself
        await mallory.signaler.send(b.key.peer_id, b.addr, seal(mallory.key, offer))
        answer = open_signal(await asyncio.wait_for(answers.get(), 10), mallory.key.peer_id,
                             NonceWindow(MAX_SKEW))
        await real.setRemoteDescription(RTCSessionDescription(answer.sdp, "answer"))
        peer, exc = await asyncio.wait_for(b.refused.get(), 15)
        assert peer == mallory.key.peer_id and isinstance(exc, AuthenticationError)
        assert "does not match the signed fingerprint" in str(exc)
        assert b.links.empty()
    finally:
        await real.close()
        await other.close()


async def test_a_bad_frame_closes_the_link(make_peer):
    a, b = await make_peer(), await make_peer()
    link = await a.endpoint.connect(b.key.peer_id, b.addr)
    other = await asyncio.wait_for(b.links.get(), 10)
    link.channel.send(b"\x01\x01\xc1\xc1")  # a lying peer bypassing the encoder
    exc = await asyncio.wait_for(other.wait_closed(), 10)
    assert isinstance(exc.error, ProtocolError) and "malformed header" in exc.reason
    await asyncio.wait_for(link.wait_closed(), 10)


async def test_a_peer_granting_credit_it_was_never_owed_is_refused(make_peer):
    a, b = await make_peer(), await make_peer()
    link = await a.endpoint.connect(b.key.peer_id, b.addr)
    other = await asyncio.wait_for(b.links.get(), 10)
    link.channel.send(wire.encode(webrtc.Credit(1 << 30), msg_id=0)[0])
    exc = await asyncio.wait_for(other.wait_closed(), 10)
    assert isinstance(exc.error, ProtocolError) and "out of range" in exc.reason


async def test_a_slow_receiver_stops_the_sender_at_the_credit_window(make_peer):
    opts = LinkOptions(window=1 << 20, recv_queue=1)
    a, b = await make_peer(options=opts), await make_peer(options=opts)
    link = await a.endpoint.connect(b.key.peer_id, b.addr)
    other = await asyncio.wait_for(b.links.get(), 10)
    chunk = np.zeros(200_000, dtype=np.uint8)

    async def send_all():
        for _ in range(30):  # 6 MB: far beyond the 1 MiB window
            await link.send(Bulk(chunk))

    sender = asyncio.create_task(send_all())

    async def blocked():
        while link._credit >= wire.MAX_FRAME:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(blocked(), 10)
    assert not sender.done()
    held = sum(map(len, other._frames._items))
    assert held <= 1 << 20
    for _ in range(30):
        assert (await asyncio.wait_for(other.recv(), 10)).data.nbytes == 200_000
    await asyncio.wait_for(sender, 10)
    await link.close()


@pytest.mark.system
@pytest.mark.parametrize("child_mode", [[], ["--standard"]], ids=["tuned", "standard"])
async def test_two_processes(make_peer, child_mode):
    me = await make_peer()
    with echo_peer("webrtc", *child_mode) as (key, port, _):
        link = await me.endpoint.connect(key.peer_id, ("127.0.0.1", port))
        assert link.tuned == (not child_mode)
        arr = np.arange(800_000, dtype=np.float32)
        await link.send(Echo("round trip", [arr]))
        back = await asyncio.wait_for(link.recv(), 20)
        assert back.text == "round trip" and np.array_equal(back.arrays[0], arr)
        for _ in range(4):
            await link.send(Bulk(np.ones(500_000, dtype=np.uint8)))
        await link.send(Flush(9))
        assert await asyncio.wait_for(link.recv(), 20) == Flushed(9, 4, 2_000_000)
        with contextlib.suppress(Exception):
            await link.close()


async def test_signaling_over_the_real_dht():
    from dht.node import DHTNode

    keys = [PeerKey.generate(), PeerKey.generate()]
    nodes = [DHTNode(k) for k in keys]
    endpoints = []
    try:
        ports = [await n.listen(0) for n in nodes]
        await nodes[1].bootstrap([("127.0.0.1", ports[0])])
        links: asyncio.Queue = asyncio.Queue()
        endpoints = [webrtc.WebRTCEndpoint(k, webrtc.DHTSignaler(n), host_addresses=LOOPBACK,
                                           on_link=links.put_nowait)
                     for k, n in zip(keys, nodes, strict=True)]
        link = await endpoints[0].connect(keys[1].peer_id, ("127.0.0.1", ports[1]))
        other = await asyncio.wait_for(links.get(), 10)
        assert other.remote == keys[0].peer_id and link.tuned
        await link.send(Echo("via dht", []))
        assert (await asyncio.wait_for(other.recv(), 10)).text == "via dht"
        await link.close()
    finally:
        for e in endpoints:
            await e.close()
        for n in nodes:
            await n.stop()


def test_turn_is_not_asked_to_reach_other_lans():
    from swarm.links.webrtc import turn_cannot_reach

    relay = ["203.0.113.9"]  # a TURN server with a public address
    assert turn_cannot_reach("192.168.1.20", "host", relay)
    assert turn_cannot_reach("fe80::1", "host", relay)
    assert turn_cannot_reach("abcd.local", "host", relay)
    assert not turn_cannot_reach("8.8.8.8", "host", relay)  # a public host candidate
    assert not turn_cannot_reach("192.168.1.20", "srflx", relay)
    assert not turn_cannot_reach("203.0.113.1", "relay", relay)
    lab = ["10.215.0.1"]  # a lab TURN server reaches its own LAN
    assert not turn_cannot_reach("10.215.0.7", "host", lab)
    assert turn_cannot_reach("10.216.1.2", "host", lab)


def test_relay_candidates_skip_unreachable_remote_hosts():
    """A remote LAN host candidate pairs with our host candidate, not our TURN one."""
    import aioice

    from swarm.links.webrtc import _relay_only_to_reachable

    conn = aioice.Connection(ice_controlling=True)

    class Proto:
        def __init__(self, host: str, kind: str) -> None:
            self.local_candidate = aioice.Candidate("1", 1, "udp", 1, host, 5000, kind)

    conn._protocols = [Proto("10.216.1.2", "host"), Proto("10.215.0.1", "relay")]
    conn._local_candidates = [p.local_candidate for p in conn._protocols]
    _relay_only_to_reachable(conn)
    conn._pair_remote_candidate(aioice.Candidate("2", 1, "udp", 1, "10.216.2.2", 6000, "host"))
    conn._pair_remote_candidate(aioice.Candidate("3", 1, "udp", 1, "10.215.0.1", 7000, "relay"))
    pairs = {(p.local_candidate.type, p.remote_candidate.type) for p in conn._check_list}
    assert pairs == {("host", "host"), ("host", "relay"), ("relay", "relay")}


async def _overrun(channel, nbytes: int, link=None) -> None:
    """A lying peer: valid 64 KiB messages written straight to the data channel, with no
    regard for the credit it was granted (it books them, so the grants it gets back stay
    in range). The receiver's application reads none: its reader stops at the window."""
    for i in range(nbytes // (64 << 10)):
        for frame in wire.encode(Bulk(np.zeros(64 << 10, np.uint8)), i + 1):
            if link is not None:
                link._credit -= len(frame)
            channel.send(bytes(frame))
        await asyncio.sleep(0)


async def test_a_peer_sending_beyond_its_credit_is_cut_off(make_peer):
    """Issue 34: the receiver counts what arrives against the window it granted (its
    application reads nothing here); a peer that sends 4x the window is closed with a
    ProtocolError and never held beyond the window."""
    opts = LinkOptions(window=1 << 20)
    a, b = await make_peer(options=opts), await make_peer(options=opts)
    link = await a.endpoint.connect(b.key.peer_id, b.addr)
    other = await asyncio.wait_for(b.links.get(), 10)
    peak = 0

    async def watch():
        nonlocal peak
        while not other.closed:
            peak = max(peak, sum(map(len, other._frames._items)))
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    await _overrun(link.channel, 4 << 20, link)
    exc = await asyncio.wait_for(other.wait_closed(), 10)
    await watcher
    assert isinstance(exc.error, ProtocolError) and "window" in exc.reason
    assert peak <= (1 << 20) + wire.MAX_FRAME
    await asyncio.wait_for(link.wait_closed(), 10)


async def test_a_tab_channel_overrunning_its_credit_is_cut_off(make_peer):
    """The same rule on a web relay's per-requester channel (swarm.links.tabs.channel_link):
    the node's end counts the tab's frames against the credit it granted."""
    from swarm.links.tabs import channel_link

    opts = LinkOptions(window=1 << 20)
    a, b = await make_peer(options=opts), await make_peer(options=opts)
    link = await a.endpoint.connect(b.key.peer_id, b.addr)
    other = await asyncio.wait_for(b.links.get(), 10)
    wrapped: asyncio.Future = asyncio.get_running_loop().create_future()

    @other.pc.on("datachannel")
    def _extra(channel):
        if channel.label == "tab":
            wrapped.set_result(channel_link(b.key.peer_id, a.key.peer_id, other.pc, channel,
                                            opts))

    raw = link.pc.createDataChannel("tab", ordered=True)
    opened = asyncio.Event()
    raw.on("open", opened.set)
    await asyncio.wait_for(opened.wait(), 10)
    tab = await asyncio.wait_for(wrapped, 10)

    await _overrun(raw, 4 << 20)
    exc = await asyncio.wait_for(tab.wait_closed(), 10)
    assert isinstance(exc.error, ProtocolError) and "window" in exc.reason
    assert not link.closed and not other.closed     # the tab's connection itself lives on
    await link.close()
