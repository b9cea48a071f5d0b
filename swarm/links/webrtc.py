"""WebRTC links: aiortc data channels, signaled without a server through signed envelopes.

The offerer sends a signed :class:`~swarm.links.signaling.Signal` with its SDP through a
:class:`Signaler` (the DHT's datagram messages, or plain UDP); the answerer verifies it,
answers the same way, and the data channel opens once ICE and DTLS succeed. aiortc checks the
remote DTLS certificate against the SDP's fingerprint, and the SDP is inside the signature,
so the link is bound to the signing peer key; a mismatch is reported as an
AuthenticationError naming both fingerprints.

Loopback: aioice leaves 127.0.0.1 out of its host candidates, so ``host_addresses`` gathers
candidates on exactly the given addresses instead (``["127.0.0.1"]`` for local swarms and
tests). No STUN/TURN unless ``ice_servers`` names some.

Speed: aiortc sends SCTP DATA chunks of ~1.2 KB and reads DTLS records into 1500-byte
buffers, which caps a data channel near 10-20 MB/s in Python. Two swarm peers may agree, in
their signed signals, on larger chunks and buffers (:class:`~swarm.links.signaling.Tuning`);
the tuning is applied per connection, only when both sides asked for it, so a standard
WebRTC peer (a browser, stock aiortc) still connects with stock behaviour.

Flow control: data channels have no receive-side backpressure, so the link adds a credit
window: the sender may have at most ``window`` bytes not yet consumed by the receiver's
reader, which grants credit back as it decodes frames; the sender also waits while the
channel's ``bufferedAmount`` is high.
"""

from __future__ import annotations

import asyncio
import inspect
import ipaddress
import logging
import secrets
import socket
import time
import types
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from aiortc import (
    RTCConfiguration,
    RTCDataChannel,
    RTCIceServer,
    RTCPeerConnection,
    RTCSessionDescription,
    rtcdtlstransport,
    rtcsctptransport,
)

from identity.keys import PeerId, PeerKey
from identity.replay import NonceWindow
from swarm import wire
from swarm.errors import AuthenticationError, LinkClosed, ProtocolError, RemoteError
from swarm.links.base import FramedLink, LinkOptions, _Channel
from swarm.links.signaling import (
    MAX_SIGNAL,
    MAX_SKEW,
    Signal,
    Tuning,
    local_path_only,
    open_signal,
    sdp_fingerprint,
    seal,
)
from swarm.loop import Supervisor

log = logging.getLogger(__name__)

Address = tuple[str, int]
Inbox = Callable[[PeerId, Address, bytes], Awaitable[None] | None]
CONNECT_TIMEOUT = 15.0
_HIGH_WATER = 4 << 20
_LOW_WATER = 1 << 20


class Signaler(Protocol):
    """Carries signed signals (<= 4 KiB) between peers; need not be trusted."""

    async def send(self, to: PeerId, addr: Address, payload: bytes) -> None:
        """Deliver ``payload`` to peer ``to`` reachable at ``addr`` (best effort)."""

    def on_message(self, callback: Inbox) -> object:
        """Call ``callback(sender, addr, payload)`` for each payload that arrives."""


@wire.message("link.credit")
class Credit(wire.Message):
    """The receiver consumed this many more bytes; the sender may send as many again."""

    nbytes: int
    """Bytes of frames consumed since the last Credit."""


# -- the link --------------------------------------------------------------------------


class CreditInbox(_Channel):
    """Frames a data channel delivered, counted on receipt against the credit granted.

    A data channel queues every message at once (no receive-side backpressure), so only the
    sender's honesty had bounded it: 128 MiB sent against a 16 MiB window were all held
    (issue 34). ``owed`` is what arrived and was not yet granted back; a peer that takes
    more than ``window`` (plus a frame: honest grants are sent even on no credit) is cut
    off with a ProtocolError and what it sent is dropped."""

    def __init__(self, window: int) -> None:
        super().__init__(1 << 30)
        self.window = window
        self.owed = 0
        self.on_overrun: Callable[[LinkClosed], None] | None = None
        """The link's abort (its reader may be waiting on its own application, not here)."""

    def put_nowait(self, item: Any, nbytes: int = 0) -> None:
        if self._closed is not None:
            return
        self.owed += len(item)
        if self.owed > self.window + wire.MAX_FRAME:
            exc = ProtocolError(f"the peer sent {self.owed} bytes unconsumed against a "
                                f"window of {self.window}")
            closed = LinkClosed(f"protocol error from peer: {exc}", exc)
            self.drop(closed)
            if self.on_overrun is not None:
                self.on_overrun(closed)
            return
        super().put_nowait(item, len(item))

    def granted(self, nbytes: int) -> None:
        """Credit for ``nbytes`` went back to the peer: it may send that much again."""
        self.owed -= nbytes


class WebRTCLink(FramedLink):
    """A PeerLink over one aiortc data channel."""

    kind = "webrtc"

    def __init__(self, local: PeerId, remote: PeerId, pc: RTCPeerConnection,
                 channel: RTCDataChannel, frames: CreditInbox, tuned: bool,
                 options: LinkOptions | None = None) -> None:
        super().__init__(local, remote, options)
        window = self.options.window
        self.pc = pc
        self.channel = channel
        self.tuned = tuned
        """Whether swarm-only transport tuning is in use on this link."""
        self._frames = frames
        frames.on_overrun = lambda exc: self._abort(exc.reason, exc.error)
        self._window = window
        self._credit = window
        self._credit_event = asyncio.Event()
        self._consumed = 0
        self._drained = asyncio.Event()
        channel.bufferedAmountLowThreshold = _LOW_WATER
        channel.on("bufferedamountlow", self._drained.set)

    async def _read_frame(self) -> bytes:
        frame = await self._frames.get()
        self._consumed += len(frame)
        if self._consumed >= self._window // 4 and self.channel.readyState == "open":
            (grant,) = wire.encode(Credit(self._consumed), msg_id=0)
            self.channel.send(grant)  # outside the send lock, never waits for credit ...
            self._credit -= len(grant)  # ... but is debited like every frame, so the peer's
            self._frames.granted(self._consumed)  # grant for it keeps the accounts exact
            self._consumed = 0
        return frame

    async def _write_frames(self, frames: list[wire.Frame]) -> None:
        channel = self.channel
        for frame in frames:
            while self._credit < len(frame):
                self._credit_event.clear()
                await self._credit_event.wait()
                if self._closed is not None:
                    raise self._closed.again()
            if channel.readyState != "open":
                raise ConnectionError("data channel closed")
            self._credit -= len(frame)
            channel.send(bytes(frame))
            if channel.bufferedAmount > _HIGH_WATER:
                self._drained.clear()
                await self._drained.wait()

    async def _dispatch(self, msg: wire.Message) -> bool:
        if isinstance(msg, Credit):
            if msg.nbytes <= 0 or self._credit + msg.nbytes > self._window:
                raise ProtocolError(f"credit of {msg.nbytes} bytes is out of range")
            self._credit += msg.nbytes
            self._credit_event.set()
            return True
        return await super()._dispatch(msg)

    def _mark_closed(self, exc: LinkClosed) -> None:
        super()._mark_closed(exc)
        self._credit_event.set()
        self._drained.set()

    async def _close_transport(self) -> None:
        if self._closing_locally:  # let the goodbye arrive: the peer closes on reading it
            try:
                await asyncio.wait_for(self._frames.closed_event.wait(), 1.0)
            except TimeoutError:
                pass
        self._frames.close(LinkClosed("connection lost: data channel closed"))
        await self.pc.close()


# -- transport tuning (per connection) -------------------------------------------------


def _retune(obj: object, cls: type, module: types.ModuleType,
            names: dict[str, int] | None = None, consts: dict[int, int] | None = None) -> None:
    """Rebind ``cls``'s methods on ``obj`` with module constants or literals replaced.

    This gives one connection aiortc's own code with different sizes, leaving every other
    connection in the process (say, a browser's) on the stock values.
    """
    tuned_globals = dict(vars(module), **(names or {}))
    for name, fn in vars(cls).items():
        if not isinstance(fn, types.FunctionType):
            continue
        code = fn.__code__
        uses_name = names and set(names) & set(code.co_names)
        uses_const = consts and set(consts) & {c for c in code.co_consts if type(c) is int}
        if not (uses_name or uses_const):
            continue
        if uses_const:
            code = code.replace(co_consts=tuple(
                consts.get(c, c) if type(c) is int else c for c in code.co_consts))
        clone = types.FunctionType(code, tuned_globals if uses_name else fn.__globals__,
                                   fn.__name__, fn.__defaults__, fn.__closure__)
        clone.__kwdefaults__ = fn.__kwdefaults__
        setattr(obj, name, types.MethodType(clone, obj))


def _apply_tuning(pc: RTCPeerConnection, tuning: Tuning) -> None:
    sctp = pc.sctp
    _retune(sctp, rtcsctptransport.RTCSctpTransport, rtcsctptransport,
            names={"USERDATA_MAX_LENGTH": tuning.sctp_chunk})
    sctp._cwnd = 3 * tuning.sctp_chunk
    _retune(sctp.transport, rtcdtlstransport.RTCDtlsTransport, rtcdtlstransport,
            consts={1500: tuning.dtls_buffer})
    for sock in _udp_sockets(pc):
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
            except OSError:
                pass


def _aiortc_tunable() -> bool:
    """Whether this aiortc still has the sizes that tuning replaces (else: stay standard)."""
    sctp, dtls = rtcsctptransport.RTCSctpTransport, rtcdtlstransport.RTCDtlsTransport
    ok = ("USERDATA_MAX_LENGTH" in sctp._send.__code__.co_names
          and 1500 in dtls._recv_next.__code__.co_consts
          and 1500 in dtls._write_ssl.__code__.co_consts)
    if not ok:
        log.warning("this aiortc version cannot be tuned; WebRTC links stay standard")
    return ok


_TUNABLE = _aiortc_tunable()


def _ice_connection(pc: RTCPeerConnection):  # -> aioice.Connection
    return pc.sctp.transport.transport.iceGatherer._connection


def _udp_sockets(pc: RTCPeerConnection) -> list[socket.socket]:
    socks = []
    for protocol in getattr(_ice_connection(pc), "_protocols", []):
        transport = getattr(protocol, "transport", None)
        sock = transport.get_extra_info("socket") if transport else None
        if sock is not None:
            socks.append(sock)
    return socks


def turn_cannot_reach(remote_host: str, remote_type: str, relay_hosts: Sequence[str]) -> bool:
    """Whether a TURN relay at ``relay_hosts`` should not be asked to send to this remote
    candidate: a host candidate on a LAN address (private, link-local, loopback, an mDNS
    name) outside the relay's own /16 (/48 for IPv6) is somebody else's LAN.

    Why: coturn tears the whole allocation down when one send to a peer fails locally
    (``sendto`` -1, e.g. no route to that LAN); aioice does not notice, keeps using the
    5-tuple, and coturn answers it as a new session (438, then 400 to ChannelBind, 437 to
    Refresh). Such a pair could never work anyway, and the relay's other pairs die with it.
    """
    if remote_type != "host":
        return False
    try:
        remote = ipaddress.ip_address(remote_host)
    except ValueError:
        return True  # an mDNS name: a LAN host by definition
    if remote.is_global:
        return False
    for relay in relay_hosts:
        try:
            net = ipaddress.ip_network(f"{relay}/{16 if ':' not in relay else 48}", strict=False)
        except ValueError:
            continue
        if remote in net:
            return False
    return True


def _relay_only_to_reachable(conn) -> None:  # conn: aioice.Connection
    """Pair this connection's TURN candidates only with remote candidates the relay can
    reach (:func:`turn_cannot_reach`); other local candidates pair with everything."""
    relay_hosts = [c.host for c in conn.local_candidates if c.type == "relay"]
    if not relay_hosts or getattr(conn, "_swarm_relay_filter", False):
        return
    pair = conn._pair_remote_candidate

    def pair_reachable(remote) -> None:
        if not turn_cannot_reach(remote.host, remote.type, relay_hosts):
            return pair(remote)
        everything = conn._protocols
        conn._protocols = [p for p in everything if p.local_candidate.type != "relay"]
        try:
            pair(remote)
        finally:
            conn._protocols = everything

    conn._pair_remote_candidate = pair_reachable
    conn._swarm_relay_filter = True


def selected_path(pc: RTCPeerConnection) -> str:
    """The nominated candidate pair as "LOCAL-REMOTE" types ("host-srflx", "relay-relay"...),
    or "none" before ICE chose one: how a link reaches its peer, for status output."""
    try:
        pair = _ice_connection(pc)._nominated.get(1)
    except AttributeError:
        return "none"
    if pair is None:
        return "none"
    return f"{pair.local_candidate.type}-{pair.remote_candidate.type}"


async def _gather_on(pc: RTCPeerConnection, addresses: Sequence[str]) -> None:
    """Gather ICE candidates on exactly ``addresses`` (aioice skips 127.0.0.1 itself)."""
    conn = _ice_connection(pc)
    if conn._local_candidates_start:
        return
    conn._local_candidates_start = True
    for component in conn._components:
        conn._local_candidates += await conn.get_component_candidates(
            component=component, addresses=list(addresses))
    conn._local_candidates_end = True


# -- the endpoint ----------------------------------------------------------------------


class WebRTCEndpoint:
    """Makes and accepts WebRTC links for one peer key over a :class:`Signaler`.

    ``on_link(link)`` gets each accepted incoming link; ``accept(peer_id)`` may refuse a
    peer (blocked) before anything is answered; ``on_refused(peer_or_None, error)`` hears
    about every signal refused (bad signature, replay, not for us...), to penalise peers.
    """

    def __init__(self, key: PeerKey, signaler: Signaler, *,
                 on_link: Callable[[WebRTCLink], Awaitable[None] | None] | None = None,
                 accept: Callable[[PeerId], bool] = lambda _: True,
                 on_refused: Callable[[PeerId | None, Exception], None] | None = None,
                 ice_servers: Sequence[str | RTCIceServer] = (),
                 host_addresses: Sequence[str] | None = None,
                 tuned: bool = True, options: LinkOptions | None = None,
                 connect_timeout: float = CONNECT_TIMEOUT, max_handshakes: int = 16) -> None:
        self.key = key
        self.signaler = signaler
        self.on_link = on_link
        self.accept = accept
        self.on_refused = on_refused
        self.ice_servers = [s if isinstance(s, RTCIceServer) else RTCIceServer(urls=s)
                            for s in ice_servers]
        self.host_addresses = list(host_addresses) if host_addresses is not None else None
        self.tuning = Tuning() if tuned and _TUNABLE else None
        self.options = options
        self.connect_timeout = connect_timeout
        self.guard = NonceWindow(MAX_SKEW)
        self._answers: dict[bytes, asyncio.Future[Signal]] = {}
        self._dialing: dict[bytes, PeerId] = {}
        self._handshakes = asyncio.Semaphore(max_handshakes)
        self._tasks = Supervisor(log, "WebRTC answer")
        self._pcs: set[RTCPeerConnection] = set()
        self._closed = False
        signaler.on_message(self._inbox)

    # -- dialing -------------------------------------------------------------------------

    async def connect(self, peer: PeerId, addr: Address) -> WebRTCLink:
        """Open a link to ``peer`` whose signaler listens at ``addr``.

        Raises TimeoutError (no answer or no connectivity), AuthenticationError (the DTLS
        certificate is not the signed one).
        """
        pc = self._new_pc()
        frames = CreditInbox((self.options or LinkOptions()).window)  # counted against credit
        opened = _opening()
        self._watch_pc(pc, frames, opened)
        channel = pc.createDataChannel("swarm", ordered=True)
        self._watch_channel(channel, frames, opened)
        session = secrets.token_bytes(16)
        answer_fut: asyncio.Future[Signal] = asyncio.get_running_loop().create_future()
        self._answers[session] = answer_fut
        self._dialing[session] = peer
        try:
            async with asyncio.timeout(self.connect_timeout):
                await self._gather(pc)
                await pc.setLocalDescription(await pc.createOffer())
                sdp = pc.localDescription.sdp
                offered = self.tuning.offer() if self._may_tune(sdp) else {}
                offer = self._signal("offer", peer, session, sdp, offered)
                await self.signaler.send(peer, addr, seal(self.key, offer))
                answer = await answer_fut
                if answer.sender != peer:
                    raise AuthenticationError(f"answer from {answer.sender.short()}, "
                                              f"expected {peer.short()}")
                tuning = (Tuning.accept(answer.tuning)
                          if offered and self._may_tune(answer.sdp) else None)
                if tuning is not None:
                    _apply_tuning(pc, tuning)
                await pc.setRemoteDescription(RTCSessionDescription(answer.sdp, "answer"))
                await self._opened(pc, opened, answer.fingerprint)
        except BaseException as exc:
            self._pcs.discard(pc)
            await pc.close()
            if isinstance(exc, TimeoutError):
                answered = answer_fut.done() and not answer_fut.cancelled()
                step = "no connectivity" if answered else "no answer"
                raise TimeoutError(f"WebRTC link to {peer.short()} at {addr[0]}:{addr[1]}: "
                                   f"{step} within {self.connect_timeout:g} s") from None
            raise
        finally:
            self._answers.pop(session, None)
            self._dialing.pop(session, None)
        return self._link(peer, pc, channel, frames, tuning is not None)

    def unreachable(self, peer: PeerId, reason: str) -> None:
        """Fail our pending dials to ``peer`` now (a relay said it cannot reach it)."""
        for session, who in list(self._dialing.items()):
            fut = self._answers.get(session)
            if who == peer and fut is not None and not fut.done():
                fut.set_exception(ConnectionError(f"WebRTC link to {peer.short()}: {reason}"))

    # -- answering -----------------------------------------------------------------------

    def _inbox(self, sender: PeerId, addr: Address, payload: bytes) -> None:
        if self._closed:
            return
        try:
            signal = open_signal(payload, self.key.peer_id, self.guard, sender=sender)
        except (ProtocolError, AuthenticationError) as exc:
            self._refused(sender, exc)
            return
        if signal.kind == "answer":
            fut = self._answers.get(signal.session)
            if fut is None or fut.done():
                self._refused(signal.sender, AuthenticationError("answer to no offer of ours"))
            else:
                fut.set_result(signal)
            return
        if not self._allowed(signal.sender):
            self._refused(signal.sender, AuthenticationError("peer not accepted (blocked)"))
            return
        if self._handshakes.locked():
            self._refused(signal.sender, RemoteError("too many handshakes at once"))
            return
        self._tasks.spawn(self._answer(signal, addr))

    async def _answer(self, offer: Signal, addr: Address) -> None:
        async with self._handshakes:
            pc = self._new_pc()
            frames = CreditInbox((self.options or LinkOptions()).window)
            opened = _opening()
            channels: list[RTCDataChannel] = []
            self._watch_pc(pc, frames, opened)

            @pc.on("datachannel")
            def _on_channel(channel: RTCDataChannel) -> None:
                if not channels:  # the first channel is the link; swarm opens only one
                    channels.append(channel)
                    self._watch_channel(channel, frames, opened)

            try:
                async with asyncio.timeout(self.connect_timeout):
                    await pc.setRemoteDescription(RTCSessionDescription(offer.sdp, "offer"))
                    await self._gather(pc)
                    own = [f"a=candidate:{c.to_sdp()}"
                           for c in _ice_connection(pc).local_candidates]
                    tuning = (Tuning.accept(offer.tuning)
                              if self._may_tune(offer.sdp, "\n".join(own)) else None)
                    if tuning is not None:
                        _apply_tuning(pc, tuning)
                    await pc.setLocalDescription(await pc.createAnswer())
                    answer = self._signal("answer", offer.sender, offer.session,
                                          pc.localDescription.sdp,
                                          tuning.offer() if tuning else {})
                    await self.signaler.send(offer.sender, addr, seal(self.key, answer))
                    await self._opened(pc, opened, offer.fingerprint)
            except Exception as exc:
                self._pcs.discard(pc)
                await pc.close()
                if isinstance(exc, AuthenticationError):
                    self._refused(offer.sender, exc)
                else:
                    log.info("WebRTC link from %s failed: %r", offer.sender.short(), exc)
                return
            link = self._link(offer.sender, pc, channels[0], frames, tuning is not None)
            if self.on_link is not None:
                try:
                    result = self.on_link(link)
                    if inspect.isawaitable(result):
                        await result
                except Exception:
                    log.exception("on_link callback failed; closing the link")
                    await link.close("internal error")

    # -- shared --------------------------------------------------------------------------

    def _signal(self, kind: str, to: PeerId, session: bytes, sdp: str,
                tuning: dict[str, int]) -> Signal:
        return Signal(kind, self.key.peer_id, to, session, secrets.token_bytes(16), time.time(),
                      sdp, sdp_fingerprint(sdp), tuning)

    async def _gather(self, pc: RTCPeerConnection) -> None:
        """Gather ICE candidates now (on ``host_addresses`` if set), before the SDP."""
        if self.host_addresses is not None:
            await _gather_on(pc, self.host_addresses)
        else:
            await _ice_connection(pc).gather_candidates()
        _relay_only_to_reachable(_ice_connection(pc))

    def _may_tune(self, *sdps: str) -> bool:
        """Tuning is offered/accepted only when wanted and every candidate is LAN-local."""
        return self.tuning is not None and local_path_only(*sdps)

    def _allowed(self, peer: PeerId) -> bool:
        try:
            return bool(self.accept(peer))
        except Exception:
            log.exception("accept callback failed; refusing %s", peer.short())
            return False

    def _refused(self, peer: PeerId | None, exc: Exception) -> None:
        log.warning("WebRTC signal from %s refused: %s", peer.short() if peer else "?", exc)
        if self.on_refused is not None:
            self.on_refused(peer, exc)

    def _new_pc(self) -> RTCPeerConnection:
        if self._closed:
            raise LinkClosed("the WebRTC endpoint is closed")
        pc = RTCPeerConnection(RTCConfiguration(iceServers=self.ice_servers))
        self._pcs.add(pc)
        return pc

    @staticmethod
    def _watch_pc(pc: RTCPeerConnection, frames: _Channel,
                  opened: asyncio.Future[None]) -> None:
        """A failed or closed connection ends ``frames`` and fails ``opened``."""

        @pc.on("connectionstatechange")
        def _on_state() -> None:
            if pc.connectionState in ("failed", "closed"):
                _gone(frames, opened, f"WebRTC connection {pc.connectionState}")

    @staticmethod
    def _watch_channel(channel: RTCDataChannel, frames: _Channel,
                       opened: asyncio.Future[None]) -> None:
        """Route the channel's messages to ``frames`` and its opening to ``opened``."""

        def on_message(data: bytes | str) -> None:
            # swarm peers send binary only; an empty frame makes the decoder refuse text
            frames.put_nowait(data if isinstance(data, bytes) else b"")

        channel.on("message", on_message)
        channel.on("open", lambda: opened.done() or opened.set_result(None))
        channel.on("close", lambda: _gone(frames, opened, "data channel closed"))
        if channel.readyState == "open" and not opened.done():
            opened.set_result(None)

    async def _opened(self, pc: RTCPeerConnection, opened: asyncio.Future[None],
                      signed_fingerprint: str) -> None:
        try:
            await opened
        except ConnectionError:
            actual = _remote_fingerprint(pc, signed_fingerprint.split()[0])
            if actual is not None and actual != signed_fingerprint:
                raise AuthenticationError(
                    f"DTLS certificate {actual} does not match the signed fingerprint "
                    f"{signed_fingerprint}") from None
            raise

    def _link(self, peer: PeerId, pc: RTCPeerConnection, channel: RTCDataChannel,
              frames: CreditInbox, tuned: bool) -> WebRTCLink:
        link = WebRTCLink(self.key.peer_id, peer, pc, channel, frames, tuned, self.options)
        link.add_close_callback(lambda _: self._pcs.discard(pc))
        link._start()
        limit = getattr(pc.sctp, "_remote_max_message_size", wire.MAX_FRAME)
        if limit < wire.MAX_FRAME:
            exc = ProtocolError(f"the peer takes data-channel messages of at most {limit} "
                                f"bytes; swarm frames need {wire.MAX_FRAME}")
            link._abort(f"protocol error: {exc}", exc)
        elif frames._closed is not None:  # closed between open and now
            link._abort(frames._closed.reason)
        return link

    async def close(self) -> None:
        """Refuse new signals and close every connection this endpoint made."""
        self._closed = True
        self._tasks.cancel()
        await asyncio.gather(*(pc.close() for pc in list(self._pcs)), return_exceptions=True)
        self._pcs.clear()


def _opening() -> asyncio.Future[None]:
    """A future for "the channel opened" whose failure need not be awaited by anybody."""
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    fut.add_done_callback(lambda f: f.cancelled() or f.exception())
    return fut


def _gone(frames: _Channel, opened: asyncio.Future[None], reason: str) -> None:
    frames.close(LinkClosed(f"connection lost: {reason}"))
    if not opened.done():
        opened.set_exception(ConnectionError(reason))


def _remote_fingerprint(pc: RTCPeerConnection, algorithm: str) -> str | None:
    """The fingerprint of the certificate the remote presented in DTLS, if it got that far."""
    try:
        ssl_conn = pc.sctp.transport._ssl
        cert = ssl_conn.get_peer_certificate(as_cryptography=True) if ssl_conn else None
    except Exception:
        return None
    if cert is None:
        return None
    return f"{algorithm} {rtcdtlstransport.certificate_digest(cert, algorithm)}"


# -- signalers -------------------------------------------------------------------------


class DHTSignaler:
    """Signals through the DHT's authenticated datagram messages (``dht.DHTNode``)."""

    def __init__(self, node: object) -> None:
        self.node = node

    async def send(self, to: PeerId, addr: Address, payload: bytes) -> None:
        await self.node.send_message(addr, payload)

    def on_message(self, callback: Inbox) -> object:
        return self.node.on_message(callback)


class UDPSignaler(asyncio.DatagramProtocol):
    """Signals over plain UDP datagrams: ``sender id (32 bytes) | signed signal``.

    The claimed sender is only a hint: the signed signal inside proves who sent it.
    """

    def __init__(self, key: PeerKey) -> None:
        self.key = key
        self._callbacks: list[Inbox] = []
        self.transport: asyncio.DatagramTransport | None = None

    @classmethod
    async def bind(cls, key: PeerKey, host: str = "127.0.0.1", port: int = 0) -> UDPSignaler:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_datagram_endpoint(lambda: cls(key),
                                                       local_addr=(host, port))
        return proto

    @property
    def port(self) -> int:
        assert self.transport is not None
        return self.transport.get_extra_info("sockname")[1]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Address) -> None:
        if len(data) < 32 or len(data) > 32 + MAX_SIGNAL:
            return
        sender = PeerId(data[:32])
        for callback in self._callbacks:
            try:
                result = callback(sender, addr, data[32:])
                if inspect.isawaitable(result):
                    asyncio.ensure_future(result)
            except Exception:
                log.exception("signal callback failed")

    async def send(self, to: PeerId, addr: Address, payload: bytes) -> None:
        assert self.transport is not None
        self.transport.sendto(self.key.peer_id.raw + payload, addr)

    def on_message(self, callback: Inbox) -> Inbox:
        self._callbacks.append(callback)
        return callback

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


__all__ = ["CONNECT_TIMEOUT", "Credit", "CreditInbox", "DHTSignaler", "Signaler", "UDPSignaler",
           "WebRTCEndpoint", "WebRTCLink",
           "selected_path", "turn_cannot_reach"]
