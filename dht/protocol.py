"""The UDP RPC protocol: kademlia's ``KademliaProtocol`` with its defects fixed.

Fixed here (see LIBRARY-FACTS.md): every handler's error becomes an error *reply* (rpcudp
sends nothing when a handler raises, so the caller waits and evicts an honest node); garbage
datagrams and wrong argument counts are answered or dropped, never raised; unknown attribute
names are AttributeErrors, not silent remote calls; ``store``/``find_value`` (unconditional
overwrite, most-common value) are not served; ``welcome_if_new`` no longer pushes possibly
stale values to new contacts; the routing table's nearest-k is exact.

Two codecs share the socket: the swarm framing (first byte 0x00 request / 0x01 response,
msgpack) and KRPC (a bencoded dict, first byte ``d``; :mod:`dht.krpc`). Both decode into
calls on :class:`dht.core.RequestCore`; this module only frames, dispatches and applies the
per-address reply budget (:class:`dht.addresses.RoundTrips`). A node with ``krpc=True``
also *sends* KRPC, so it can live among mainline nodes that know nothing of swarm.

Read-only nodes (BEP 43): a node with ``read_only`` (a short-lived CLI process: ``swarm
status``, a one-shot submit, ``swarm dht get``) marks every query it sends (KRPC: top-level
``ro`` = 1; the swarm framing: a third element ``{"ro": 1}``) and answers no queries. A node
receiving a marked query answers it but never adds, refreshes or challenges the sender as a
contact, so it is never handed out in answers either: once the process exits, nobody's
lookups wait out an RPC timeout on it. The flag is the sender's word and only about itself:
it can keep its sender out of our table, never take anyone out of it (a spoofed ``ro``
query changes no contact), and BEP 44 writes stay bound to the sender's address by the
write token, not by the routing table.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
from collections.abc import Awaitable
from typing import Any, Protocol

import umsgpack
from kademlia.node import Node
from kademlia.protocol import KademliaProtocol
from rpcudp.protocol import RPCProtocol

from dht import errors, krpc
from dht.addresses import RoundTrips
from dht.announce import Announcement, check_topic, topic_target
from dht.bencode import bdecode, bencode
from dht.core import RequestCore
from dht.errors import BencodeError, DHTError, ItemError
from dht.items import MutableItem
from dht.messages import Envelope, ReplayGuard
from dht.routing import NearestRoutingTable
from dht.rtt import RttEstimator
from dht.stats import Stats
from dht.store import ItemStore
from dht.tokens import TokenIssuer
from dht.wire import (
    KRPC_FORMS,
    REQUESTS,
    RETRYABLE,
    announcement_from_wire,
    announcement_to_wire,
    error_reply,
    is_node_id,
    mutable_from_wire,
    mutable_to_wire,
    node_to_wire,
)
from identity import PeerId

log = logging.getLogger(__name__)
_NO_REPLY = object()
PADDED = ("find_node", "get", "peers", "own")  # requests padded on first contact
MAX_CODECS = 4096  # addresses whose codec is remembered
PAD_BYTES = 600  # 3x a padded get covers a 1000-byte item with 20 contacts


class _Counted:
    """The UDP transport with a byte counter on ``sendto`` (for the scale benchmark)."""

    def __init__(self, transport: Any, stats: Any) -> None:
        self._transport = transport
        self._stats = stats

    def sendto(self, data: bytes, addr: Any = None) -> None:
        self._stats.bytes_out += len(data)
        self._transport.sendto(data, addr)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class ProtocolHost(Protocol):
    """What the protocol needs of the node that owns it (:class:`dht.node.DHTNode` is one).
    Attributes are read when used, not copied: ``krpc`` turns on when a mainline node
    answers, and the node may change its id (``node``) for BEP 42."""

    node: Node
    store: ItemStore
    ksize: int
    rpc_timeout: float
    require_bep42: bool
    krpc: bool
    read_only: bool
    tokens: TokenIssuer
    replay: ReplayGuard
    stats: Stats

    def clock(self) -> float: ...

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Run ``coro`` in the background, supervised by the node."""

    def deliver(self, sender: PeerId, addr: tuple[str, int], payload: bytes) -> None:
        """A verified message arrived."""

    def own_announcements(self, topic: bytes, now: float) -> list[Announcement]: ...

    def met_mainline(self, addr: tuple[str, int]) -> None:
        """``addr`` answered only in KRPC."""

    def note_alive(self, node: Node) -> None: ...

    def note_failed(self, node: Node) -> None: ...

    def note_external(self, reporter: tuple[str, int], seen: str) -> None:
        """A KRPC answer from ``reporter`` saw us at IP ``seen``."""


class DHTProtocol(KademliaProtocol):
    """One node's RPC endpoint. Handlers are ``rpc_<name>(addr, nodeid, *args)``."""

    def __init__(self, dht: ProtocolHost) -> None:
        KademliaProtocol.__init__(self, dht.node, dht.store, dht.ksize)
        self._wait_timeout = dht.rpc_timeout
        self.router = NearestRoutingTable(self, dht.ksize, dht.node)
        self.router.require_bep42 = dht.require_bep42
        self.dht = dht
        self.rtt = RttEstimator()
        self.round_trips = RoundTrips()
        self.core = RequestCore(dht.node.id, dht.store, dht.tokens, dht.replay,
                                self._nodes_near, dht.deliver, dht.own_announcements)
        self._challenges: set[tuple[str, int]] = set()
        self._known_by: dict[tuple[str, int], None] = {}  # nodes that answered us in full
        self._krpc_pending: dict[bytes, tuple[asyncio.Future, asyncio.TimerHandle, tuple]] = {}
        self._swarm_at: dict[tuple[str, int], bool] = {}  # see speaks_swarm
        self._next_t = int.from_bytes(os.urandom(2), "big")

    def connection_made(self, transport: Any) -> None:
        RPCProtocol.connection_made(self, _Counted(transport, self.dht.stats))

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.dht.stats.bytes_in += len(data)
        RPCProtocol.datagram_received(self, data, addr)

    def __getattr__(self, name: str) -> Any:
        # rpcudp turns any unknown attribute into a remote call; a typo must fail loudly.
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    # -- outgoing ---------------------------------------------------------------------------

    def speaks_swarm(self, address: tuple[str, int]) -> bool | None:
        """What the node at ``address`` answered in: True the swarm framing (a swarm node:
        it answered a swarm request, or its KRPC carried :data:`krpc.CLIENT`), False KRPC
        only (a mainline node), None not known yet. Learned from answers, never from
        queries (a spoofed query must not change how we talk to an address)."""
        return self._swarm_at.get((str(address[0]), int(address[1])))

    def _note_codec(self, address: tuple[str, int], swarm: bool) -> None:
        addr = (str(address[0]), int(address[1]))
        self._swarm_at.pop(addr, None)
        self._swarm_at[addr] = swarm
        if not swarm:
            self.dht.met_mainline(addr)
        while len(self._swarm_at) > MAX_CODECS:
            self._swarm_at.pop(next(iter(self._swarm_at)))

    async def request(self, address: tuple[str, int], name: str, *args: Any,
                      unproven: bool = False) -> tuple[bool, Any]:
        """Send one request; (True, reply) or (False, None) on timeout. No routing changes.

        ``unproven``: the address came from someone else's unsigned word (BEP 5 values) and
        has never answered us: no padding and no second-codec ping go to it (issue 34), so
        what we send there is no larger than what named it.

        The codec follows :meth:`speaks_swarm`: KRPC to a mainline node (a request it has no
        KRPC form for is not sent: (False, None)), the swarm framing to a swarm node, and to
        an address not known yet KRPC when the node is in KRPC mode, else the swarm framing.
        """
        if name not in REQUESTS or len(args) != REQUESTS[name]:
            raise ValueError(f"no request {name!r} with {len(args)} arguments")
        if self.transport is None or self.transport.is_closing():
            return False, None
        address = (str(address[0]), int(address[1]))
        swarm = self._swarm_at.get(address)
        if name not in KRPC_FORMS:
            if swarm is False:
                return False, None  # a mainline node drops the swarm framing unanswered
        elif swarm is False or (swarm is None and self.dht.krpc):
            return await self._krpc_request(address, name, args)
        return await self._swarm_request(address, name, args, unproven)

    async def ping_any(self, address: tuple[str, int]) -> tuple[bool, Any]:
        """Ping an address in both codecs at once (a bootstrap node may be a mainline node
        or a swarm node); the first answer, which also teaches :meth:`speaks_swarm`."""
        address = (str(address[0]), int(address[1]))
        if self._swarm_at.get(address) is not None:
            return await self.request(address, "ping")
        tries = [asyncio.ensure_future(self._krpc_request(address, "ping", ())),
                 asyncio.ensure_future(self._swarm_request(address, "ping", ()))]
        result: tuple[bool, Any] = (False, None)
        try:
            for done in asyncio.as_completed(tries):
                result = await done
                if result[0]:
                    break
        finally:
            for t in tries:
                t.cancel()
            await asyncio.gather(*tries, return_exceptions=True)
        return result

    async def _swarm_request(self, address: tuple[str, int], name: str, args: tuple,
                             unproven: bool = False) -> tuple[bool, Any]:
        # QUIC's answer to the reflection budget: a first request to a node that may not
        # know our address yet is padded, so that a full reply fits 3x its size and needs
        # no retry round trip; the padding rides in the cookie slot (an invalid cookie).
        # Never to an address only someone else named (``unproven``): padding there is
        # reflection, whoever named it.
        extra: tuple = ()
        if name in PADDED and address not in self._known_by and not unproven:
            extra = (bytes(PAD_BYTES),)
        for attempt in range(2):
            future = self._send_swarm(address, name, (self.source_node.id, *args, *extra))
            clock = asyncio.get_running_loop().time
            started = clock()
            self.dht.stats.requests += 1
            result = await future
            if result[0]:
                self.rtt.sample(clock() - started)
            elif address not in self._swarm_at and not unproven:
                # maybe a mainline node (they drop this framing): one KRPC ping tells
                self.dht.spawn(self._krpc_request(address, "ping", ()))
            cookie = result[1].get("retry") if isinstance(result[1], dict) else None
            if attempt or name not in RETRYABLE or not isinstance(cookie, bytes):
                if result[0] and name in RETRYABLE:
                    self._known_by[address] = None  # it answered in full: it knows us
                    while len(self._known_by) > 4096:
                        self._known_by.pop(next(iter(self._known_by)))
                return result
            extra = (cookie,)  # prove our address and ask again
        return result

    def _send_swarm(self, address: tuple[str, int], name: str, args: tuple) -> asyncio.Future:
        """Send one request in the swarm framing (rpcudp's, ``0x00 + id + [name, args]``);
        a read-only node adds ``{"ro": 1}`` as a third element. The future gets (True,
        reply) or, after the RPC timeout, (False, None)."""
        body: list[Any] = [name, args]
        if self.dht.read_only:
            body.append({"ro": 1})
        data = umsgpack.packb(body)
        if len(data) > 8192:  # rpcudp's limit for one datagram
            raise DHTError(f"request {name} is too large for one datagram")
        msg_id = os.urandom(20)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        timer = loop.call_later(self._wait_timeout, self._timeout, msg_id)
        self._outstanding[msg_id] = (future, timer)
        self.transport.sendto(b"\x00" + msg_id + data, address)
        return future

    async def call(self, node: Node, name: str, *args: Any) -> Any | None:
        """A request to a routing contact: the reply, or None (and the contact is dropped)."""
        result = await self.request((node.ip, node.port), name, *args)
        if not result[0]:
            self.dht.note_failed(node)
        self.handle_call_response(result, node)
        return result[1] if result[0] else None

    # kademlia's own helpers (call_ping, bootstrap, bucket refresh) use these two names.
    def ping(self, address: tuple[str, int], nodeid: bytes):
        return self.request(address, "ping")

    def find_node(self, address: tuple[str, int], nodeid: bytes, key: bytes):
        return self.request(address, "find_node", key)

    def welcome_if_new(self, node: Node) -> None:
        """Add or refresh a contact. No values are pushed (kademlia's push can spread stale
        values; replication here is the publisher's re-put and the get's write-back)."""
        if node.id != self.source_node.id and is_node_id(node.id):
            self.dht.note_alive(node)
            self.router.add_contact(node)

    def stop(self) -> None:
        pending = [*self._outstanding.values(), *(e[:2] for e in self._krpc_pending.values())]
        for future, timer in pending:
            timer.cancel()
            if not future.done():
                future.set_result((False, None))
        self._outstanding.clear()
        self._krpc_pending.clear()

    # -- KRPC (mainline) client ---------------------------------------------------------------

    async def _krpc_request(self, address: tuple[str, int], name: str, args: tuple
                            ) -> tuple[bool, Any]:
        """``name(*args)`` as a KRPC query; the answer in the swarm framing's shapes, so
        lookups and writes above do not care which wire a contact speaks."""
        self._next_t = (self._next_t + 1) & 0xFFFF
        t = self._next_t.to_bytes(2, "big")
        method, a = _krpc_query_args(name, args)
        a[b"id"] = self.source_node.id
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        timer = loop.call_later(self._wait_timeout, self._krpc_timeout, t)
        self._krpc_pending[t] = (future, timer, address)
        started = loop.time()
        self.dht.stats.requests += 1
        self.transport.sendto(krpc.query(t, method, a, ro=self.dht.read_only), address)
        ok, msg = await future
        if not ok:
            return False, None
        self.rtt.sample(loop.time() - started)
        return True, _krpc_answer_shape(name, msg)

    def _krpc_timeout(self, t: bytes) -> None:
        entry = self._krpc_pending.pop(t, None)
        if entry is not None and not entry[0].done():
            entry[0].set_result((False, None))

    # -- incoming ---------------------------------------------------------------------------

    async def _solve_datagram(self, datagram: bytes, address: tuple) -> None:
        if self.transport is None or self.transport.is_closing():
            return  # read before the node stopped, run after: its store is closed, no reply goes
        address = (address[0], address[1])  # an IPv6 socket adds flowinfo and scope id
        if datagram[:1] == b"d":
            self._accept_krpc(datagram, address)
            return
        if len(datagram) < 22:
            return
        try:
            data = umsgpack.unpackb(datagram[21:])
        except Exception:  # any garbage: drop it (umsgpack raises many types)
            log.debug("undecodable datagram from %s", address)
            return
        if datagram[:1] == b"\x00":
            if self.dht.read_only:
                return  # BEP 43: a read-only node answers no queries
            await self._accept_request(datagram[1:21], data, address, len(datagram))
        elif datagram[:1] == b"\x01":
            self._accept_response(datagram[1:21], data, address)

    def _accept_response(self, msg_id: bytes, data: Any, address: tuple[str, int]) -> None:
        entry = self._outstanding.pop(msg_id, None)
        if entry is None:
            return
        self.round_trips.note(address)
        self._note_codec(address, True)
        future, timer = entry
        timer.cancel()
        if not future.done():
            future.set_result((True, data))

    def _timeout(self, msg_id: bytes) -> None:
        entry = self._outstanding.pop(msg_id, None)
        if entry is not None and not entry[0].done():
            entry[0].set_result((False, None))

    async def _accept_request(self, msg_id: bytes, data: Any, address: tuple[str, int],
                              size: int) -> None:
        reply = await self.dispatch(data, address, size)
        if reply is _NO_REPLY or self.transport is None or self.transport.is_closing():
            return
        out = b"\x01" + msg_id + umsgpack.packb(reply)
        if not self.round_trips.allows(address, size, len(out)):
            log.debug("dropping a %d-byte reply to unproven %s", len(out), address)
            return
        self.transport.sendto(out, address)

    def _accept_krpc(self, datagram: bytes, address: tuple[str, int]) -> None:
        try:
            msg = krpc.decode(datagram)
        except krpc.KrpcError as exc:
            log.debug("dropping a bad KRPC datagram from %s: %s", address, exc)
            return
        if msg.y != b"q":
            entry = self._krpc_pending.get(msg.t)
            if entry is None or entry[2] != tuple(address):
                return  # unknown transaction, or an answer from the wrong address
            del self._krpc_pending[msg.t]
            future, timer, _ = entry
            timer.cancel()
            self.round_trips.note(address)
            self._note_codec(address, msg.from_swarm)
            if msg.ip is not None:
                self.dht.note_external(address, msg.ip[0])
            if not future.done():
                future.set_result((True, msg))
            return
        if self.dht.read_only:
            return  # BEP 43: a read-only node answers no queries
        out = self._krpc_answer(msg, tuple(address), len(datagram))
        if out is None or not self.round_trips.allows(address, len(datagram), len(out)):
            return  # (an error answer can be long too)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(out, address)

    _TRIM = ((b"values",), (b"v", b"k", b"sig", b"seq"), (b"nodes", b"nodes6"), (b"token",))

    def _krpc_answer(self, msg: krpc.KrpcMessage, sender: tuple[str, int], size: int
                     ) -> bytes | None:
        """The datagram answering one KRPC query (bounded for an unproven sender)."""
        nodeid = msg.body.get(b"id")
        if not is_node_id(nodeid):
            return krpc.error(msg.t, errors.PROTOCOL, "id must be 20 bytes")
        try:
            body = self._krpc_handle(msg.q, msg.body, sender, self.dht.clock())
        except ItemError as exc:
            return krpc.error(msg.t, exc.code, exc.message)
        except Exception:
            log.exception("KRPC %r failed on a query from %s", msg.q[:20], sender)
            return krpc.error(msg.t, errors.SERVER, "server error")
        if not msg.ro:
            self._welcome(sender, nodeid, krpc=True)
        body[b"id"] = self.source_node.id
        out = krpc.response(msg.t, body, sender)
        for group in self._TRIM:  # a reflection amplifier only for proven addresses
            if self.round_trips.allows(sender, size, len(out)):
                return out
            for key in group:
                body.pop(key, None)
            out = krpc.response(msg.t, body, sender)
        return out

    def _krpc_handle(self, q: bytes, a: dict, sender: tuple[str, int], now: float) -> dict:
        core = self.core
        want = krpc.wants(a, sender)
        if q == b"ping":
            return {}
        if q == b"get_peers":
            peers = core.get_peers(sender, a.get(b"info_hash"), now)
            body = {b"token": peers.token, **krpc.node_fields(peers.nodes, want)}
            if peers.values:
                body[b"values"] = [krpc.pack_peer(v) for v in peers.values]
            return body
        if q == b"announce_peer":
            port = sender[1] if a.get(b"implied_port") == 1 else a.get(b"port")
            core.announce_peer(sender, a.get(b"token"), a.get(b"info_hash"), port, now)
            return {}
        if q == b"get":
            seq = a.get(b"seq")
            got = core.get(sender, a.get(b"target"), now,
                           seq if isinstance(seq, int) and not isinstance(seq, bool) else None)
            body = {b"token": got.token, **krpc.node_fields(got.nodes, want)}
            if got.mutable is not None:
                m = got.mutable
                body.update({b"v": m.value, b"k": m.pubkey, b"sig": m.signature, b"seq": m.seq})
            elif got.immutable is not None:
                body[b"v"] = bdecode(got.immutable)
            return body
        if q == b"put":
            if b"v" not in a:
                raise ItemError(errors.PROTOCOL, "put without v")
            encoded = bencode(a[b"v"])
            if b"k" in a:
                item = MutableItem.from_wire(a[b"k"], a.get(b"salt", b""), a.get(b"seq"),
                                             encoded, a.get(b"sig"))
                core.put_mutable(sender, a.get(b"token"), item, a.get(b"cas"), now)
            else:
                core.put_immutable(sender, a.get(b"token"), encoded, now)
            return {}
        target = a.get(b"target", a.get(b"info_hash"))
        if q == b"find_node" or target is not None:  # unknown methods with a target: as
            return krpc.node_fields(core.find_node(sender, target, now), want)  # as BEP 5
        raise ItemError(krpc.METHOD_UNKNOWN, "method unknown")

    def _retry_target(self, name: str, args: Any) -> bytes | None:
        """The target a retry token for this request is bound to, if it has one."""
        try:
            if name in ("get_peers", "own"):
                return topic_target(check_topic(args[1]))
            return args[1] if name in RETRYABLE and is_node_id(args[1]) else None
        except (ItemError, IndexError):
            return None

    async def dispatch(self, data: Any, address: tuple[str, int], size: int | None = None
                       ) -> Any:
        """Run one decoded request; always a reply (an error map for anything wrong).

        ``size`` is the request datagram's length: a large reply to an address that has not
        completed a round trip becomes ``{"retry": token}`` (``None``: no such check).
        """
        if not (isinstance(data, list | tuple) and len(data) in (2, 3)
                and isinstance(data[0], str) and isinstance(data[1], list | tuple)
                and (len(data) == 2 or isinstance(data[2], dict))):
            return error_reply(errors.PROTOCOL, "malformed request")
        name, args = data[0], data[1]
        read_only = len(data) == 3 and data[2].get("ro") == 1
        if name not in REQUESTS:
            return error_reply(204, f"method unknown: {name[:40]}")
        target = self._retry_target(name, args)
        if target is not None and len(args) == REQUESTS[name] + 2:
            if self.dht.tokens.check(args[-1], address, target, self.dht.clock()):
                self.round_trips.note(address)
            args = args[:-1]
        if len(args) != REQUESTS[name] + 1:
            return error_reply(errors.PROTOCOL, f"{name} takes {REQUESTS[name] + 1} arguments")
        if not is_node_id(args[0]):
            return error_reply(errors.PROTOCOL, "node id must be 20 bytes")
        if not read_only:  # BEP 43: a read-only sender never becomes a contact
            self._welcome(tuple(address), args[0])
        try:
            result = getattr(self, f"rpc_{name}")(tuple(address), *args)
            if inspect.isawaitable(result):
                result = await result
        except ItemError as exc:
            return error_reply(exc.code, exc.message)
        except Exception:
            log.exception("handler %s failed on a request from %s", name, address)
            return error_reply(errors.SERVER, "server error")
        if (size is not None and target is not None
                and not self.round_trips.allows(address, size,
                                                 21 + len(umsgpack.packb(result)))):
            return {"retry": self.dht.tokens.issue(address, target, self.dht.clock())}
        return result

    def _welcome(self, sender: tuple[str, int], nodeid: bytes, krpc: bool = False) -> Node:
        """The requester as a contact: added to the routing table once its address has
        answered (a spoofed source cannot plant contacts), else challenged with a ping."""
        source = Node(nodeid, sender[0], sender[1])
        known = self.router.buckets[self.router.get_bucket_for(source)].nodes.get(nodeid)
        if self.round_trips.proven(sender) or (
                known is not None and (known.ip, known.port) == tuple(sender)):
            self.welcome_if_new(source)  # a contact we already checked: just refresh it
        else:
            self._challenge(source, krpc)
        return source

    MAX_CHALLENGES = 64

    def _challenge(self, node: Node, krpc: bool = False) -> None:
        addr = (node.ip, node.port)
        if addr in self._challenges or len(self._challenges) >= self.MAX_CHALLENGES:
            return
        if self.transport is None or self.transport.is_closing():
            return
        self._challenges.add(addr)

        async def verify() -> None:
            try:
                ok, data = await (self._krpc_request(addr, "ping", ()) if krpc
                                  else self.request(addr, "ping"))
                if ok and data == node.id:  # one socket answers ping with one id
                    self.welcome_if_new(node)
            finally:
                self._challenges.discard(addr)

        self.dht.spawn(verify())

    def rpc_ping(self, sender, nodeid):
        return self.source_node.id

    def rpc_find_node(self, sender, nodeid, key):
        return [node_to_wire(n) for n in self.core.find_node(sender, key, self.dht.clock())]

    def rpc_get(self, sender, nodeid, target):
        answer = self.core.get(sender, target, self.dht.clock())
        reply: dict[str, Any] = {"token": answer.token,
                                 "nodes": [node_to_wire(n) for n in answer.nodes]}
        if answer.mutable is not None:
            reply["m"] = mutable_to_wire(answer.mutable)
        elif answer.immutable is not None:
            reply["i"] = answer.immutable
        return reply

    def rpc_put(self, sender, nodeid, token, kind, item, cas):
        now = self.dht.clock()
        if kind == "m":
            self.core.put_mutable(sender, token, mutable_from_wire(item), cas, now)
        elif kind == "i":
            self.core.put_immutable(sender, token, item, now)
        else:
            raise ItemError(errors.PROTOCOL, "kind must be 'm' or 'i'")
        return {"ok": True}

    def rpc_peers(self, sender, nodeid, info_hash):
        answer = self.core.get_peers(sender, info_hash, self.dht.clock())
        return {"token": answer.token, "nodes": [node_to_wire(n) for n in answer.nodes],
                "values": [list(v) for v in answer.values]}

    def rpc_announce_peer(self, sender, nodeid, token, info_hash, port):
        self.core.announce_peer(sender, token, info_hash, port, self.dht.clock())
        return {"ok": True}

    def rpc_get_peers(self, sender, nodeid, topic, after):
        answer = self.core.get_topic(sender, topic, after, self.dht.clock())
        return {"token": answer.token, "nodes": [node_to_wire(n) for n in answer.nodes],
                "peers": [announcement_to_wire(a) for a in answer.page], "more": answer.more}

    def rpc_announce(self, sender, nodeid, token, topic, entry):
        self.core.announce(sender, token, topic,
                           lambda t: announcement_from_wire(t, entry), self.dht.clock())
        return {"ok": True}

    def rpc_own(self, sender, nodeid, topic):
        return {"peers": [announcement_to_wire(a)
                          for a in self.core.own(sender, topic, self.dht.clock())]}

    def rpc_message(self, sender, nodeid, envelope):
        self.core.message((sender[0], sender[1]), Envelope.from_wire(envelope),
                          self.dht.clock())
        return {"ok": True}

    def _nodes_near(self, target: bytes, sender: tuple[str, int]) -> list[Node]:
        return [n for n in self.router.find_neighbors(Node(target), self.router.ksize + 1)
                if (n.ip, n.port) != tuple(sender)][:self.router.ksize]


def _krpc_query_args(name: str, args: tuple) -> tuple[str, dict]:
    """The KRPC method and arguments for one of the swarm framing's requests."""
    if name == "ping":
        return "ping", {}
    if name == "find_node":
        return "find_node", {b"target": args[0]}
    if name == "get":
        return "get", {b"target": args[0]}
    if name == "peers":
        return "get_peers", {b"info_hash": args[0]}
    if name == "announce_peer":
        token, info_hash, port = args
        return "announce_peer", {b"token": token or b"", b"info_hash": info_hash,
                                 b"port": port, b"implied_port": 0}
    token, kind, item, cas = args  # put
    if kind == "i":
        return "put", {b"token": token or b"", b"v": bdecode(item)}
    pubkey, salt, seq, encoded, sig = item
    a = {b"token": token or b"", b"k": pubkey, b"seq": seq, b"sig": sig, b"v": bdecode(encoded)}
    if salt:
        a[b"salt"] = salt
    if cas is not None:
        a[b"cas"] = cas
    return "put", a


def _krpc_answer_shape(name: str, msg: krpc.KrpcMessage) -> Any:
    """A KRPC answer in the shape the swarm framing's reply to ``name`` has."""
    if msg.y == b"e":
        return error_reply(*msg.error)
    r = msg.body
    nodes = [node_to_wire(n) for n in krpc.answer_nodes(r)]
    token = r.get(b"token") if isinstance(r.get(b"token"), bytes) else None
    if name == "ping":
        return r.get(b"id")
    if name == "find_node":
        return nodes
    if name == "peers":
        return {"token": token, "nodes": nodes,
                "values": [list(v) for v in krpc.unpack_values(r.get(b"values"))]}
    if name == "get":
        reply: dict[str, Any] = {"token": token, "nodes": nodes}
        if b"v" in r:
            try:
                encoded = bencode(r[b"v"])
            except BencodeError:
                return reply
            if b"k" in r:  # BEP 44 answers carry no salt: the asker fills in its own
                reply["m"] = [r[b"k"], None, r.get(b"seq"), encoded, r.get(b"sig")]
            else:
                reply["i"] = encoded
        return reply
    return {"ok": True}  # put, announce_peer
