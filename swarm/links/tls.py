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
``LinkOptions.frame_timeout``.
"""

from __future__ import annotations

import asyncio
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

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT = 10.0
_LEN = 4
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


class TLSLink(FramedLink):
    """A PeerLink over one TLS 1.3 connection."""

    kind = "tls"

    def __init__(self, local: PeerId, remote: PeerId, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, options: LinkOptions | None = None) -> None:
        super().__init__(local, remote, options)
        self._reader = reader
        self._writer = writer
        writer.transport.set_write_buffer_limits(high=4 * wire.MAX_FRAME)

    @property
    def peer_address(self) -> tuple[str, int]:
        return self._writer.get_extra_info("peername")[:2]

    async def _read_frame(self) -> bytes:
        head = await self._reader.readexactly(_LEN)
        size = int.from_bytes(head, "big")
        if size > self.options.limits.max_frame:
            raise ProtocolError(f"frame of {size} bytes exceeds {self.options.limits.max_frame}")
        try:
            async with asyncio.timeout(self.options.frame_timeout):
                return await self._reader.readexactly(size)
        except TimeoutError:
            raise ProtocolError(f"frame of {size} bytes incomplete after "
                                f"{self.options.frame_timeout:g} s (peer stalled)") from None

    async def _write_frames(self, frames: list[bytes]) -> None:
        write = self._writer.write
        for frame in frames:
            write(len(frame).to_bytes(_LEN, "big") + frame)
        await self._writer.drain()

    async def _close_transport(self) -> None:
        self._writer.close()
        try:
            await asyncio.wait_for(self._writer.wait_closed(), 2.0)
        except Exception:  # a stalled peer never answers close_notify
            self._writer.transport.abort()


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
    tasks: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        try:
            remote = peer_id_of(writer.get_extra_info("ssl_object").getpeercert(True))
        except Exception as exc:
            log.warning("TLS peer %s refused: %s", peername, exc)
            writer.transport.abort()
            return
        link = TLSLink(key.peer_id, remote, reader, writer, options)
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
            task = asyncio.ensure_future(result)
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    server = await asyncio.start_server(
        handle, host, port, ssl=ctx, ssl_handshake_timeout=HANDSHAKE_TIMEOUT,
        limit=2 * wire.MAX_FRAME)
    return TLSServer(server)


async def connect(key: PeerKey, host: str, port: int, expect: PeerId, *,
                  options: LinkOptions | None = None,
                  timeout: float = HANDSHAKE_TIMEOUT) -> TLSLink:
    """Dial a peer and prove both identities; refuse it unless it is ``expect``.

    Raises AuthenticationError (somebody else answered, or the peer refused us),
    OSError/TimeoutError (nobody there).
    """
    ctx = make_context(key, server=False)
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(
            host, port, ssl=ctx, server_hostname=host, limit=2 * wire.MAX_FRAME,
            ssl_handshake_timeout=timeout)
    try:
        remote = peer_id_of(writer.get_extra_info("ssl_object").getpeercert(True))
        if remote != expect:
            raise AuthenticationError(f"{host}:{port} is {remote.short()}, not the expected "
                                      f"{expect.short()} (refusing a possible MITM)")
        link = TLSLink(key.peer_id, remote, reader, writer, options)
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
        writer.transport.abort()
        raise
    link._start()
    return link


__all__ = ["TLSLink", "TLSServer", "Welcome", "connect", "listen", "make_context",
           "peer_certificate", "peer_id_of"]
