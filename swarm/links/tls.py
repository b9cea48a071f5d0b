"""Direct links: TCP + TLS 1.3 with mutual authentication bound to the peer keys.

Each side presents a certificate whose public key *is* its Ed25519 peer key, and TLS 1.3's
CertificateVerify proves it holds the private key, so the PeerId read from the verified
certificate is authenticated. Python's ``ssl`` has no verify callback, so to make OpenSSL
accept such certificates at all, every leaf is issued by a well-known *public* anchor key
(derived from a constant): the anchor vouches for nothing, anybody can mint leaves under it,
and identity comes only from the leaf's key plus the handshake signature. A dialer states the
PeerId it expects and refuses anybody else (no MITM); a listener's ``accept`` refuses
blocked peers right after the handshake, with a goodbye that says why.

Framing on the stream: ``u32 length (big-endian) | frame``; a length above the frame limit
is refused before anything is read, and a frame that starts must finish within
``LinkOptions.frame_timeout``. Received bytes are decrypted where they end up (see
:class:`_Stream`): an array chunk straight into the array being received.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import hashlib
import inspect
import logging
import os
import secrets
import ssl
import tempfile
from collections.abc import Awaitable, Callable
from functools import lru_cache

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from identity.keys import PeerId, PeerKey
from swarm import wire
from swarm.errors import AuthenticationError, LinkClosed, ProtocolError
from swarm.links import shm
from swarm.links.base import FramedLink, Goodbye, LinkOptions
from swarm.loop import Supervisor

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT = 10.0
_LEN = 4
STAGE = 256 << 10
"""The staging buffer small frames are decrypted into and cut out of."""
DIRECT = 64 << 10
"""Frames this large are decrypted into their own buffer, or (an array chunk) into the
array, instead of staging; and written without joining them to their length."""
_ANCHOR_SEED = hashlib.sha256(b"swarm tls anchor v1: public on purpose, vouches for nothing"
                              ).digest()
_NOT_BEFORE = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)
_NOT_AFTER = datetime.datetime(9999, 12, 31, tzinfo=datetime.UTC)


@wire.message("link.welcome")
class Welcome(wire.Message):
    """The listener's first message: it accepted the dialer (a refusal is a Goodbye)."""

    version: int
    """The listener's wire protocol version."""
    shm_pid: int | None = None
    """Set when the listener offers shared memory (the dialer looks on this host): its pid."""
    shm_fd: int | None = None
    """The sealed memfd in that process holding the challenge (see swarm.links.shm)."""


# -- certificates ----------------------------------------------------------------------


@lru_cache(maxsize=1)
def _anchor() -> tuple[Ed25519PrivateKey, x509.Certificate]:
    key = Ed25519PrivateKey.from_private_bytes(_ANCHOR_SEED)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "swarm public tls anchor")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1)
            .not_valid_before(_NOT_BEFORE).not_valid_after(_NOT_AFTER)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, False, False,
                                         False), critical=True)
            .sign(key, None))
    return key, cert


def peer_certificate(key: PeerKey) -> x509.Certificate:
    """A TLS leaf certificate carrying ``key``'s public key (subject CN = PeerId)."""
    anchor_key, anchor_cert = _anchor()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, str(key.peer_id))])
    return (x509.CertificateBuilder().subject_name(name).issuer_name(anchor_cert.subject)
            .public_key(key.private_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_NOT_BEFORE).not_valid_after(_NOT_AFTER)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(anchor_key, None))


def peer_id_of(der: bytes | None) -> PeerId:
    """The PeerId in a peer's verified certificate (DER)."""
    if not der:
        raise AuthenticationError("the peer presented no certificate")
    public = x509.load_der_x509_certificate(der).public_key()
    if not isinstance(public, Ed25519PublicKey):
        raise AuthenticationError("the peer's certificate key is not Ed25519")
    return PeerId(public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


@lru_cache(maxsize=16)
def make_context(key: PeerKey, server: bool) -> ssl.SSLContext:
    """A TLS 1.3-only context presenting ``key``'s certificate and requiring the peer's
    (cached per key object: a context serves any number of connections)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata=_anchor()[1].public_bytes(serialization.Encoding.PEM)
                              .decode())
    # ssl loads keys only from files: write an encrypted PEM (random one-time password) to a
    # private temp file, load it, delete it, so the peer key never lies on disk in clear.
    password = secrets.token_bytes(32)
    pem = (key.private_key.private_bytes(serialization.Encoding.PEM,
                                         serialization.PrivateFormat.PKCS8,
                                         serialization.BestAvailableEncryption(password))
           + peer_certificate(key).public_bytes(serialization.Encoding.PEM))
    fd, path = tempfile.mkstemp(prefix="swarm-tls-", suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        ctx.load_cert_chain(path, password=password)
    finally:
        os.unlink(path)
    return ctx


# -- the link --------------------------------------------------------------------------


class _Stream(asyncio.BufferedProtocol):
    """One TLS connection's plaintext, cut into frames where it lands.

    The TLS transport decrypts into the buffer :meth:`get_buffer` returns. Small frames are
    cut out of a staging buffer (one copy each); a large frame gets a buffer of its own, and
    an array chunk's data goes straight into the array being received: the link's decoder
    names the place once it has checked the chunk's header (:meth:`wire.Decoder.chunk_target`),
    which it can only do when it has been fed every frame before. What is queued for the
    reader is bounded (reading pauses); a started frame must finish in ``timeout``.
    """

    def __init__(self, max_frame: int, timeout: float,
                 on_connect: Callable[[_Stream], None] | None = None) -> None:
        self.transport: asyncio.Transport | None = None
        self.decoder: wire.Decoder | None = None
        """The reader's decoder (set by the link): asked where chunk data goes."""
        self._on_connect = on_connect
        self._max_frame = max_frame
        self._timeout = timeout
        self._stage = bytearray(STAGE)
        self._view = memoryview(self._stage)
        self._start = self._end = 0
        self._fill: memoryview | None = None  # where the current large frame's body goes
        self._fill_pos = 0
        self._fill_frame: bytes | bytearray = b""  # handed out once it is full
        self._fill_landed = 0  # bytes of it written in place (into an array)
        self._partial = 0  # size of the frame being received (0: none started)
        self._frames: collections.deque[tuple[bytes | bytearray, int]] = collections.deque()
        self._queued = 0
        self._handed = 0
        self._done = 0
        self._waiter: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._backlog = False  # reading paused: the reader is far behind
        self._for_reader = False  # reading paused: a chunk waits for the reader to catch up
        self._peek = False  # read only the next frame's head (a large one may come)
        self._timer: asyncio.TimerHandle | None = None
        self.landed = 0
        """Bytes of array data decrypted straight into their arrays so far."""
        self.lost = asyncio.get_running_loop().create_future()
        """Done when the connection is gone."""

    # -- asyncio protocol callbacks ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        transport.set_write_buffer_limits(high=4 * wire.MAX_FRAME)
        if self._on_connect is not None:
            self._on_connect(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._fill is not None:
            return self._fill[self._fill_pos:]
        if self._start and len(self._stage) - self._end < DIRECT:  # room for a whole one
            n = self._end - self._start
            self._stage[:n] = self._view[self._start:self._end]
            self._start, self._end = 0, n
        stop = self._start + _LEN + wire.CHUNK_HEAD
        if self._peek and stop > self._end:  # a frame's head first, then its data in place
            return self._view[self._end:stop]
        return self._view[self._end:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._fill is not None:
            self._fill_pos += nbytes
            if self._fill_pos == len(self._fill):
                frame, self._fill, self._fill_frame = self._fill_frame, None, b""
                self._peek = True
                self._emit(frame, self._fill_landed)
            return
        self._end += nbytes
        self._cut()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionResetError("the peer closed the connection"))
        if self._timer is not None:
            self._timer.cancel()
        if not self.lost.done():
            self.lost.set_result(None)

    def pause_writing(self) -> None:
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._drain = None

    # -- the link's side ---------------------------------------------------------------------

    async def next_frame(self) -> tuple[bytes | bytearray, int]:
        """The next frame, and how many of its bytes were written in place (not in it).

        The caller feeds every frame to the decoder before it asks for the next one."""
        if self._for_reader and not self._frames:  # the decoder has seen every frame now
            self._for_reader = False
            self._cut()
            self._reading()
        while not self._frames:
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        frame, landed = self._frames.popleft()
        self._queued -= len(frame)
        self._handed += 1
        if self._backlog and self._queued <= self._max_frame:
            self._backlog = False
            self._reading()
        return frame, landed

    async def drain(self) -> None:
        if self._error is not None and not isinstance(self._error, ProtocolError):
            raise ConnectionResetError(str(self._error))
        if self._drain is not None:
            await asyncio.shield(self._drain)

    # -- internals ---------------------------------------------------------------------------

    def _cut(self) -> None:
        """Cut whole frames out of staging; start a large frame's own buffer."""
        view = self._view
        while (avail := self._end - self._start) >= _LEN:
            at = self._start
            size = int.from_bytes(view[at:at + _LEN], "big")
            if size > self._max_frame:
                self._fail(ProtocolError(f"frame of {size} bytes exceeds {self._max_frame}"))
                return
            if avail - _LEN >= size:
                self._start = at + _LEN + size
                self._emit(bytes(view[at + _LEN:self._start]), 0)
                continue
            self._partial = size
            body = view[at + _LEN:self._end]
            if size < DIRECT:
                self._peek = False
                break
            chunk = len(body) < 2 or body[1] == wire.KIND_CHUNK
            if chunk and len(body) < wire.CHUNK_HEAD:
                self._peek = True  # the rest of its head first, then its data in place
                break
            self._peek = False
            if chunk and not self._current():
                self._for_reader = True  # its data goes in place once the reader is here
                self._reading()
            else:
                self._direct(size, body)
            break
        if self._start == self._end:
            self._start = self._end = 0
        self._arm()

    def _direct(self, size: int, body: memoryview) -> None:
        """Receive the rest of this large frame into the array (a chunk) or its own buffer."""
        head = wire.CHUNK_HEAD
        target = None
        if len(body) >= head and body[1] == wire.KIND_CHUNK and self._current():
            assert self.decoder is not None
            target = self.decoder.chunk_target(body[:head], size - head)
        if target is not None:
            n = len(body) - head
            target[:n] = body[head:]
            self._fill, self._fill_pos, self._fill_frame = target, n, bytes(body[:head])
            self._fill_landed = len(target)
            self.landed += len(target)
        else:
            own = bytearray(size)
            own[:len(body)] = body
            self._fill, self._fill_pos, self._fill_frame = memoryview(own), len(body), own
            self._fill_landed = 0
        self._start = self._end = 0

    def _emit(self, frame: bytes | bytearray, landed: int) -> None:
        self._done += 1
        self._partial = 0
        self._frames.append((frame, landed))
        self._queued += len(frame)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        if not self._backlog and self._queued > 2 * self._max_frame:
            self._backlog = True
            self._reading()

    def _current(self) -> bool:
        """Whether the decoder has been fed every frame received before this one."""
        return self.decoder is not None and not self._frames \
            and self.decoder.fed == self._handed

    def _reading(self) -> None:
        """Read while nobody waits for the reader (and the stream is not broken)."""
        t = self.transport
        if t is None or t.is_closing():
            return
        if self._backlog or self._for_reader or isinstance(self._error, ProtocolError):
            if t.is_reading():
                t.pause_reading()
        elif not t.is_reading():
            t.resume_reading()

    def _arm(self) -> None:
        """A frame that started must finish within the timeout (a stalled peer)."""
        if self._partial and self._timer is None and self._error is None:
            self._timer = asyncio.get_running_loop().call_later(
                self._timeout, self._check_stall, self._done)

    def _check_stall(self, done: int) -> None:
        self._timer = None
        ours = self._backlog or self._for_reader  # we stopped reading, not the peer sending
        if self._partial and self._done == done and not ours:
            self._fail(ProtocolError(f"frame of {self._partial} bytes incomplete after "
                                     f"{self._timeout:g} s (peer stalled)"))
        else:
            self._arm()

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._reading()  # nothing more is read from a broken stream


class TLSLink(FramedLink):
    """A PeerLink over one TLS 1.3 connection."""

    kind = "tls"

    def __init__(self, local: PeerId, remote: PeerId, stream: _Stream,
                 options: LinkOptions | None = None) -> None:
        super().__init__(local, remote, options)
        self._stream = stream
        stream.decoder = self._decoder

    @property
    def peer_address(self) -> tuple[str, int]:
        assert self._stream.transport is not None
        return self._stream.transport.get_extra_info("peername")[:2]

    async def _read_frame(self) -> bytes | bytearray:
        frame, landed = await self._stream.next_frame()
        self._bytes_received += landed
        return frame

    async def _write_frames(self, frames: list[wire.Frame]) -> None:
        transport = self._stream.transport
        assert transport is not None
        if transport.is_closing():
            raise ConnectionResetError("the connection is closing")
        for frame in frames:
            if isinstance(frame, wire.Chunk):  # the array's bytes as they lie
                transport.write(len(frame).to_bytes(_LEN, "big") + frame.head)
                transport.write(frame.data)
            elif len(frame) < DIRECT:
                transport.write(len(frame).to_bytes(_LEN, "big") + frame)
            else:  # no copy to join them: the length goes in a TLS record of its own
                transport.write(len(frame).to_bytes(_LEN, "big"))
                transport.write(frame)
        await self._stream.drain()

    async def _close_transport(self) -> None:
        transport = self._stream.transport
        assert transport is not None
        transport.close()
        try:
            await asyncio.wait_for(asyncio.shield(self._stream.lost), 2.0)
        except Exception:  # a stalled peer never answers close_notify
            transport.abort()


async def _first_message(link: TLSLink, timeout: float) -> wire.Message:
    """Read one frame outside the reader task (before it starts)."""
    async with asyncio.timeout(timeout):
        frame = await link._read_frame()
    msgs = link._decoder.feed(frame)
    if len(msgs) != 1:
        raise ProtocolError("the first frame must be one whole message")
    return msgs[0]


async def _answer_shm(link: TLSLink, pid: int, fd: int) -> None:
    """Dialer: answer the listener's shared-memory challenge, then use shared memory.

    Any failure (another pid namespace or user, no /proc) just leaves the link on TLS.
    """
    try:
        answer = shm.answer(pid, fd)
    except ProtocolError as exc:
        log.info("no shared memory with %s: %s", link.remote.short(), exc)
        return
    channel = shm.Channel(pid)
    channel.hold(answer, 32)  # closed when the listener's ShmDone names it
    try:
        await link._send_frames(wire.encode(shm.ShmAck(os.getpid(), answer)))
    except BaseException:
        channel.close()
        raise
    link.use_shm(channel)


class TLSServer:
    """A listening TLS endpoint; :func:`listen` makes one."""

    def __init__(self, server: asyncio.Server) -> None:
        self._server = server

    @property
    def port(self) -> int:
        return self._server.sockets[0].getsockname()[1]

    @property
    def host(self) -> str:
        return self._server.sockets[0].getsockname()[0]

    async def close(self) -> None:
        """Stop accepting (links already made stay open)."""
        self._server.close()
        await self._server.wait_closed()

    async def __aenter__(self) -> TLSServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


OnLink = Callable[[TLSLink], Awaitable[None] | None]


async def listen(key: PeerKey, host: str = "127.0.0.1", port: int = 0, *,
                 on_link: OnLink, accept: Callable[[PeerId], bool] = lambda _: True,
                 options: LinkOptions | None = None) -> TLSServer:
    """Accept TLS links; ``on_link(link)`` gets each authenticated and accepted one.

    ``accept(peer_id)`` runs right after the handshake: False refuses that peer (blocked)
    with a goodbye saying so.
    """
    ctx = make_context(key, server=True)
    handlers = Supervisor(log, "TLS link handler")  # links made outlive the server
    opts = options or LinkOptions()

    def spawn(stream: _Stream) -> None:
        handlers.spawn(handle(stream), on_error=lambda _exc: _crashed(stream))

    def _crashed(stream: _Stream) -> None:
        if stream.transport is not None:
            stream.transport.abort()

    async def handle(stream: _Stream) -> None:
        transport = stream.transport
        assert transport is not None
        peername = transport.get_extra_info("peername")
        try:
            remote = peer_id_of(transport.get_extra_info("ssl_object").getpeercert(True))
        except Exception as exc:
            log.warning("TLS peer %s refused: %s", peername, exc)
            transport.abort()
            return
        link = TLSLink(key.peer_id, remote, stream, options)
        try:
            allowed = accept(remote)
        except Exception:
            log.exception("accept callback failed; refusing %s", remote.short())
            allowed = False
        if not allowed:
            log.info("TLS peer %s refused: not accepted (blocked)", remote.short())
        if not allowed:
            first: wire.Message = Goodbye("refused: peer not accepted")
        elif shm.supported() and shm.colocated(peername[0]):
            link._shm_offer = offer = shm.make_offer()
            first = Welcome(wire.PROTOCOL_VERSION, offer.pid, offer.fd)
        else:
            first = Welcome(wire.PROTOCOL_VERSION)
        try:
            await link._send_frames(wire.encode(first))
        except (LinkClosed, ConnectionError) as exc:
            log.info("TLS peer %s left during the handshake: %s", remote.short(), exc)
            allowed = False
        if not allowed:
            link._mark_closed(LinkClosed("refused during the handshake"))
            await link._close_transport()
            return
        link._start()
        result = on_link(link)
        if inspect.isawaitable(result):
            await result

    server = await asyncio.get_running_loop().create_server(
        lambda: _Stream(opts.limits.max_frame, opts.frame_timeout, spawn), host, port,
        ssl=ctx, ssl_handshake_timeout=HANDSHAKE_TIMEOUT)
    return TLSServer(server)


async def connect(key: PeerKey, host: str, port: int, expect: PeerId, *,
                  options: LinkOptions | None = None,
                  timeout: float = HANDSHAKE_TIMEOUT) -> TLSLink:
    """Dial a peer and prove both identities; refuse it unless it is ``expect``.

    Raises AuthenticationError (somebody else answered, or the peer refused us),
    OSError/TimeoutError (nobody there).
    """
    ctx = make_context(key, server=False)
    opts = options or LinkOptions()
    async with asyncio.timeout(timeout):
        transport, stream = await asyncio.get_running_loop().create_connection(
            lambda: _Stream(opts.limits.max_frame, opts.frame_timeout), host, port,
            ssl=ctx, server_hostname=host, ssl_handshake_timeout=timeout)
    try:
        remote = peer_id_of(transport.get_extra_info("ssl_object").getpeercert(True))
        if remote != expect:
            raise AuthenticationError(f"{host}:{port} is {remote.short()}, not the expected "
                                      f"{expect.short()} (refusing a possible MITM)")
        link = TLSLink(key.peer_id, remote, stream, options)
        try:
            first = await _first_message(link, timeout)
        except (ssl.SSLError, ConnectionError, asyncio.IncompleteReadError) as exc:
            raise AuthenticationError(f"{expect.short()} refused our certificate: {exc}"
                                      ) from None
        if isinstance(first, Goodbye):
            raise AuthenticationError(f"{expect.short()} refused the link: {first.reason}")
        if not isinstance(first, Welcome):
            raise ProtocolError(f"expected a welcome, got {type(first).__name__}")
        if first.shm_pid is not None and first.shm_fd is not None and shm.supported() \
                and shm.colocated(host):
            await _answer_shm(link, first.shm_pid, first.shm_fd)
    except BaseException:
        transport.abort()
        raise
    link._start()
    return link


__all__ = ["TLSLink", "TLSServer", "Welcome", "connect", "listen", "make_context",
           "peer_certificate", "peer_id_of"]
