"""Member data relay ("circuits", after libp2p's circuit relay): where neither a direct path
nor TURN joins two peers, a member both hold links to may carry their link's bytes.

Opt-in per member (``swarm join/publish --relay-data RATE``), capped in bytes per second
over all circuits it carries, and end to end encrypted: the two ends run an authenticated
ephemeral X25519 exchange (each signs the transcript with its peer key; the dialer checks the
answer against the peer it meant), derive one ChaCha20-Poly1305 key per direction, and
number their frames; the relay sees sizes and timing only, and any change, drop or
reordering it makes closes the circuit (``ProtocolError``).

Messages: :class:`CircuitOpen` (dialer -> relay) becomes :class:`CircuitIncoming`
(relay -> receiver); :class:`CircuitAccept` goes back the same way; :class:`CircuitData`
and :class:`CircuitClose` flow both ways, each side using the circuit number it knows.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from identity.keys import PeerId, PeerKey, verify
from identity.replay import NonceWindow, Replayed
from swarm import wire
from swarm.errors import AuthenticationError, LinkClosed, ProtocolError
from swarm.links.base import FramedLink, LinkOptions, PeerLink, _Channel
from swarm.links.signaling import MAX_SKEW  # a dialer's hello: a signal like any other
from swarm.loop import Supervisor

log = logging.getLogger(__name__)

_DOMAIN = b"swarm circuit v2\x00"
MAX_CIRCUITS = 64
"""Circuits one relay carries at once, and circuit links one peer holds at once."""
MAX_PER_SENDER = 8
"""Circuits one relay carries at once for the same dialer."""
CONNECT_TIMEOUT = 10.0
_RELAY_IDS = 1 << 31
"""Dialers number their circuits below this, relays from here up."""


@wire.message("circuit.open")
class CircuitOpen(wire.Message):
    """Dialer -> relay: open circuit ``circuit`` (the dialer's number) to ``to``."""

    to: PeerId
    """The peer to reach; the relay must hold a link to it."""
    circuit: int
    """The dialer's number for this circuit."""
    hello: bytes
    """The dialer's ephemeral X25519 key, the time it signed (ms since the epoch) and its
    signature over both (:meth:`CircuitEndpoint.connect`)."""


@wire.message("circuit.incoming")
class CircuitIncoming(wire.Message):
    """Relay -> receiver: ``sender`` opens circuit ``circuit`` (the receiver's number)."""

    sender: PeerId
    """Who opened it, as the relay's link authenticated it (the hello's signature decides)."""
    circuit: int
    """The receiver's number for this circuit."""
    hello: bytes
    """As the dialer sent it."""


@wire.message("circuit.accept")
class CircuitAccept(wire.Message):
    """Receiver -> relay -> dialer: the circuit is open."""

    circuit: int
    """The number the message's receiver knows the circuit by."""
    hello: bytes
    """The receiver's ephemeral key and signature over both keys."""


@wire.message("circuit.data")
class CircuitData(wire.Message):
    """One sealed frame of the relayed link."""

    circuit: int
    """The number the message's receiver knows the circuit by."""
    data: np.ndarray
    """ChaCha20-Poly1305 ciphertext of one link frame (uint8)."""


@wire.message("circuit.close")
class CircuitClose(wire.Message):
    """The circuit is closed (or refused)."""

    circuit: int
    """The number the message's receiver knows the circuit by."""
    reason: str
    """Why, in words."""


# -- the handshake and the sealed frames ------------------------------------------------


def _raw(pub: X25519PublicKey) -> bytes:
    return pub.public_bytes(Encoding.Raw, PublicFormat.Raw)


def _transcript(role: bytes, dialer: PeerId, receiver: PeerId, *keys: bytes) -> bytes:
    return _DOMAIN + role + dialer.raw + receiver.raw + b"".join(keys)


def _split(hello: bytes) -> tuple[bytes, bytes]:
    if len(hello) != 32 + 64:
        raise ProtocolError("circuit hello malformed")
    return hello[:32], hello[32:]


def _split_dialer(hello: bytes) -> tuple[bytes, bytes, bytes]:
    """(ephemeral key, signing time as 8 bytes, signature) of a dialer's hello."""
    if len(hello) != 32 + 8 + 64:
        raise ProtocolError("circuit hello malformed")
    return hello[:32], hello[32:40], hello[40:]


def _keys(eph: X25519PrivateKey, other: bytes, dialer: PeerId, receiver: PeerId,
          eph_d: bytes, eph_r: bytes) -> tuple[bytes, bytes]:
    try:
        shared = eph.exchange(X25519PublicKey.from_public_bytes(other))
    except ValueError:
        raise ProtocolError("circuit hello carries a bad key") from None
    okm = HKDF(hashes.SHA256(), 64, salt=None,
               info=_transcript(b"k", dialer, receiver, eph_d, eph_r)).derive(shared)
    return okm[:32], okm[32:]  # dialer -> receiver, receiver -> dialer


class _Sealer:
    """One direction's AEAD with a frame counter as nonce (the relay link is ordered)."""

    def __init__(self, key: bytes) -> None:
        self._aead = ChaCha20Poly1305(key)
        self._n = 0

    def _nonce(self) -> bytes:
        self._n += 1
        return self._n.to_bytes(12, "little")

    def seal(self, frame: bytes) -> bytes:
        return self._aead.encrypt(self._nonce(), frame, None)

    def open(self, data: bytes) -> bytes:
        try:
            return self._aead.decrypt(self._nonce(), data, None)
        except InvalidTag:
            raise ProtocolError("circuit frame altered, dropped or reordered") from None


# -- the relayed link ------------------------------------------------------------------


class CircuitLink(FramedLink):
    """A PeerLink whose frames travel sealed through a relay member."""

    kind = "circuit"

    def __init__(self, local: PeerId, remote: PeerId, relay: PeerLink, circuit: int,
                 send_key: bytes, recv_key: bytes, options: LinkOptions | None = None) -> None:
        super().__init__(local, remote, options)
        self.relay = relay
        """The link to the member carrying this circuit."""
        self.circuit = circuit
        self._out, self._in = _Sealer(send_key), _Sealer(recv_key)
        self.frames = _Channel(64)

    async def _read_frame(self) -> bytes:
        return self._in.open(await self.frames.get())

    async def _write_frames(self, frames: list[wire.Frame]) -> None:
        for frame in frames:
            sealed = np.frombuffer(self._out.seal(bytes(frame)), np.uint8)
            await self.relay.send(CircuitData(self.circuit, sealed))

    async def _close_transport(self) -> None:
        self.frames.close(LinkClosed("connection lost: circuit closed"))
        if not self.relay.closed:
            try:
                await self.relay.send(CircuitClose(self.circuit, "closed"))
            except ConnectionError:
                pass


# -- the two ends ----------------------------------------------------------------------


class CircuitEndpoint:
    """Opens circuits through relays and accepts circuits opened to us.

    ``on_link(link)`` gets each accepted circuit link; ``accept(peer)`` may refuse a peer
    first. The owner passes every circuit message read from any member link to
    :meth:`handle`.
    """

    def __init__(self, key: PeerKey, on_link: Callable[[CircuitLink], Awaitable[None] | None],
                 accept: Callable[[PeerId], bool] = lambda _: True,
                 options: LinkOptions | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.key = key
        self.on_link = on_link
        self.accept = accept
        self.options = options
        self.clock = clock
        """Wall clock (hellos carry their signing time)."""
        self._hellos = NonceWindow(MAX_SKEW, max_entries=4096, max_per_sender=64)
        """Dialers' ephemeral keys seen within :data:`MAX_SKEW` (a hello is taken once)."""
        self._pending: dict[tuple[int, int], tuple[PeerId, X25519PrivateKey, bytes,
                                                   asyncio.Future[bytes]]] = {}
        self._links: dict[tuple[int, int], CircuitLink] = {}
        self._tasks = Supervisor(log, "circuit link handler")

    async def connect(self, relay: PeerLink, peer: PeerId,
                      timeout: float = CONNECT_TIMEOUT) -> CircuitLink:
        """A circuit link to ``peer`` through ``relay`` (ConnectionError if refused,
        TimeoutError, AuthenticationError if the answer is not ``peer``'s)."""
        cid = secrets.randbelow(_RELAY_IDS)  # relays number from _RELAY_IDS up: no clash
        eph = X25519PrivateKey.generate()
        eph_d = _raw(eph.public_key())
        at = int(self.clock() * 1000).to_bytes(8, "big")
        hello = eph_d + at + self.key.sign(_transcript(b"d", self.key.peer_id, peer, eph_d,
                                                       at))
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        slot = (id(relay), cid)
        self._pending[slot] = (peer, eph, eph_d, fut)
        try:
            await relay.send(CircuitOpen(peer, cid, hello))
            async with asyncio.timeout(timeout):
                answer = await fut
        finally:
            self._pending.pop(slot, None)
        eph_r, sig = _split(answer)
        if not verify(peer, sig, _transcript(b"r", self.key.peer_id, peer, eph_d, eph_r)):
            raise AuthenticationError(f"circuit answer is not {peer.short()}'s")
        to_r, to_d = _keys(eph, eph_r, self.key.peer_id, peer, eph_d, eph_r)
        return self._open(relay, cid, peer, to_r, to_d)

    def _open(self, relay: PeerLink, cid: int, peer: PeerId, send: bytes,
              recv: bytes) -> CircuitLink:
        link = CircuitLink(self.key.peer_id, peer, relay, cid, send, recv, self.options)
        slot = (id(relay), cid)
        self._links[slot] = link
        link.add_close_callback(lambda _: self._links.pop(slot, None))
        relay.add_close_callback(lambda _: link._abort("connection lost: relay link closed"))
        link._start()
        return link

    async def handle(self, relay: PeerLink, msg: wire.Message) -> bool:
        """Act on a circuit message read from ``relay``; False if it is not one."""
        slot = (id(relay), getattr(msg, "circuit", -1))
        if isinstance(msg, CircuitData):
            link = self._links.get(slot)
            if link is not None:
                await link.frames.put(msg.data.tobytes())
        elif isinstance(msg, CircuitAccept):
            pending = self._pending.get(slot)
            if pending is not None and not pending[3].done():
                pending[3].set_result(msg.hello)
        elif isinstance(msg, CircuitClose):
            pending = self._pending.get(slot)
            if pending is not None and not pending[3].done():
                pending[3].set_exception(ConnectionError(
                    f"relay {relay.remote.short()} refused a circuit: {msg.reason}"))
            link = self._links.get(slot)
            if link is not None:
                link._abort(f"connection lost: circuit closed ({msg.reason})")
        elif isinstance(msg, CircuitIncoming):
            await self._incoming(relay, msg)
        else:
            return False
        return True

    async def _incoming(self, relay: PeerLink, msg: CircuitIncoming) -> None:
        try:
            eph_d, at, sig = _split_dialer(msg.hello)
            now = self.clock()
            sent = int.from_bytes(at, "big") / 1000
            try:
                self._hellos.check_time(sent, now)
                if not verify(msg.sender, sig, _transcript(b"d", msg.sender, self.key.peer_id,
                                                           eph_d, at)):
                    raise AuthenticationError(f"circuit hello is not {msg.sender.short()}'s")
                # a relay replaying a captured hello (issue 34): the replayed circuit
                # would have replaced the dialer's live one, then died of silence
                self._hellos.admit(msg.sender.raw, eph_d, sent, now)
            except Replayed as exc:
                raise AuthenticationError(f"circuit hello {exc}") from None
            if not self.accept(msg.sender):
                raise AuthenticationError("peer not accepted (blocked)")
            if len(self._links) >= MAX_CIRCUITS:
                raise AuthenticationError(f"holding {MAX_CIRCUITS} circuits already")
        except (ProtocolError, AuthenticationError) as exc:
            log.warning("circuit from %s refused: %s", msg.sender.short(), exc)
            await relay.send(CircuitClose(msg.circuit, f"refused: {exc}"))
            return
        eph = X25519PrivateKey.generate()
        eph_r = _raw(eph.public_key())
        hello = eph_r + self.key.sign(_transcript(b"r", msg.sender, self.key.peer_id, eph_d,
                                                  eph_r))
        to_r, to_d = _keys(eph, eph_d, msg.sender, self.key.peer_id, eph_d, eph_r)
        link = self._open(relay, msg.circuit, msg.sender, to_d, to_r)
        await relay.send(CircuitAccept(msg.circuit, hello))
        result = self.on_link(link)
        if asyncio.iscoroutine(result):
            self._tasks.spawn(result)

    async def close(self) -> None:
        for link in list(self._links.values()):
            await link.close("shutting down")
        self._tasks.cancel()


# -- the relay -------------------------------------------------------------------------


@dataclass
class _Hop:
    link: PeerLink
    circuit: int


class DataRelay:
    """Carries circuits between the peers in ``links`` (the node's member links), at most
    ``rate`` bytes/s over all of them (0: refuse every circuit)."""

    def __init__(self, links: dict[PeerId, PeerLink], rate: int,
                 max_circuits: int = MAX_CIRCUITS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.links, self.rate, self.max_circuits, self.clock = links, rate, max_circuits, clock
        self._route: dict[tuple[int, int], _Hop] = {}
        self._dialer: dict[tuple[int, int], PeerId] = {}
        self._opened_by: dict[PeerId, int] = {}
        self._ids = itertools.count(_RELAY_IDS)
        self._tokens = float(rate)
        self._at = clock()
        self.carried = 0

    async def _pace(self, nbytes: int) -> None:
        """Wait until ``nbytes`` fit under the cap (a token bucket of one second)."""
        while True:
            now = self.clock()
            self._tokens = min(float(self.rate), self._tokens + (now - self._at) * self.rate)
            self._at = now
            if self._tokens >= min(nbytes, self.rate):
                self._tokens -= nbytes
                return
            await asyncio.sleep((min(nbytes, self.rate) - self._tokens) / self.rate)

    async def handle(self, link: PeerLink, msg: wire.Message) -> bool:
        """Act on a circuit message read from ``link``; False if it is not for a relay."""
        if isinstance(msg, CircuitOpen):
            await self._open(link, msg)
            return True
        if not isinstance(msg, CircuitData | CircuitAccept | CircuitClose):
            return False
        hop = self._route.get((id(link), msg.circuit))
        if hop is None:
            return False  # not a circuit we carry: maybe one that ends here
        try:
            if isinstance(msg, CircuitData):
                await self._pace(msg.data.nbytes)
                self.carried += msg.data.nbytes
                await hop.link.send(CircuitData(hop.circuit, msg.data))
            elif isinstance(msg, CircuitAccept):
                await hop.link.send(CircuitAccept(hop.circuit, msg.hello))
            else:
                self._drop(link, msg.circuit)
                await hop.link.send(CircuitClose(hop.circuit, msg.reason))
        except ConnectionError:
            self._drop(link, msg.circuit)
        return True

    async def _open(self, link: PeerLink, msg: CircuitOpen) -> None:
        target = self.links.get(msg.to)
        if self.rate <= 0:
            why = "this member does not relay data"
        elif target is None or target.closed or msg.to == link.remote:
            why = f"no link to {msg.to.short()}"
        elif self._opened_by.get(link.remote, 0) >= MAX_PER_SENDER:
            why = f"relaying {MAX_PER_SENDER} circuits for you already"
        elif len(self._route) >= 2 * self.max_circuits and not await self._make_room(link):
            why = (f"relaying {self.max_circuits} circuits already, none beyond its dialer's "
                   f"fair share of {self._share(link.remote)}")
        else:
            cid = next(self._ids)
            self._route[(id(link), msg.circuit)] = _Hop(target, cid)
            self._route[(id(target), cid)] = _Hop(link, msg.circuit)
            self._dialer[(id(link), msg.circuit)] = self._dialer[(id(target), cid)] = link.remote
            self._opened_by[link.remote] = self._opened_by.get(link.remote, 0) + 1
            for end in (link, target):
                end.add_close_callback(lambda gone: self._gone(gone))
            await target.send(CircuitIncoming(link.remote, cid, msg.hello))
            return
        await link.send(CircuitClose(msg.circuit, why))

    def _share(self, dialer: PeerId) -> int:
        """Circuits each dialer may hold when the relay is full (max-min fair)."""
        dialers = len(self._opened_by) + (dialer not in self._opened_by)
        return max(1, self.max_circuits // dialers)

    async def _make_room(self, link: PeerLink) -> bool:
        """The relay is full: a dialer under its fair share takes the newest circuit of the
        dialer holding the most, if that one is over its share (issue 34: eight throw-away
        keys at eight circuits each had filled all 64 for everybody)."""
        share = self._share(link.remote)
        if self._opened_by.get(link.remote, 0) >= share:
            return False
        top = max(self._opened_by, key=self._opened_by.__getitem__)
        if self._opened_by[top] <= share:
            return False
        newest = next(key for key in reversed(self._dialer)
                      if self._dialer[key] == top and key in self._route
                      and self._route[key].link.remote != top)
        hop = self._route[newest]                    # towards the receiver
        back = self._route[(id(hop.link), hop.circuit)]  # towards the dialer
        self._drop(hop.link, hop.circuit)
        why = f"relay full: {top.short()} held more than its fair share of {share} circuits"
        for end, circuit in ((hop.link, hop.circuit), (back.link, back.circuit)):
            if not end.closed:
                await _quiet(end.send(CircuitClose(circuit, why)))
        return True

    def _drop(self, link: PeerLink, circuit: int) -> None:
        hop = self._route.pop((id(link), circuit), None)
        if hop is not None:
            self._route.pop((id(hop.link), hop.circuit), None)
            self._dialer.pop((id(hop.link), hop.circuit), None)
            dialer = self._dialer.pop((id(link), circuit), None)
            if dialer is not None:
                left = self._opened_by.get(dialer, 1) - 1
                if left > 0:
                    self._opened_by[dialer] = left
                else:
                    self._opened_by.pop(dialer, None)

    def _gone(self, link: PeerLink) -> None:
        for (lid, cid), hop in list(self._route.items()):
            if lid == id(link):
                self._drop(link, cid)
                if not hop.link.closed:
                    asyncio.ensure_future(_quiet(hop.link.send(
                        CircuitClose(hop.circuit, "relay lost the other end"))))


async def _quiet(coro) -> None:
    try:
        await coro
    except ConnectionError:
        pass


__all__ = ["CircuitAccept", "CircuitClose", "CircuitData", "CircuitEndpoint", "CircuitIncoming",
           "CircuitLink", "CircuitOpen", "DataRelay"]
