"""DHTNode: a kademlia ``Server`` holding BEP 44 items, announcements and signed messages.

The routing table, node model, UDP transport and RPC framing are kademlia's and rpcudp's;
this subclass replaces the parts that are wrong for signed, versioned items (see
:mod:`dht.protocol` and :mod:`dht.lookup`) and adds persistence without pickle.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import ipaddress
import json
import logging
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

from kademlia.network import Server
from kademlia.node import Node

from dht import errors
from dht.addresses import ExternalAddress, bep42_id, bep42_valid, is_local
from dht.announce import (
    MAX_TTL,
    Announcement,
    check_topic,
    entry_from_value,
    entry_value,
    topic_target,
)
from dht.bencode import Value, bdecode
from dht.errors import (
    DHTError,
    ItemError,
    LookupFailed,
    MessageRefused,
    MessageTooLarge,
    PeerUnreachable,
)
from dht.items import (
    MutableItem,
    Signer,
    check_salt,
    decide_mutable_store,
    encode_value,
    mutable_target,
    public_bytes_of,
)
from dht.lookup import GRACE, LookupResult, lookup
from dht.messages import MAX_PAYLOAD, Envelope, ReplayGuard
from dht.protocol import DHTProtocol
from dht.routing import NearestRoutingTable
from dht.stats import Stats
from dht.store import ITEM_TTL, MAX_ITEMS, MAX_PER_TOPIC, ItemStore, Published
from dht.tokens import TokenIssuer
from dht.validators import Validator, Validators
from dht.wire import (
    GetReply,
    PeersReply,
    PeerValues,
    announcement_from_wire,
    announcement_to_wire,
    is_node_id,
    mutable_from_wire,
    mutable_to_wire,
    parse_nodes,
    reply_error,
)
from identity import PeerId, PeerKey
from identity.files import write_private

log = logging.getLogger(__name__)

MessageCallback = Callable[[PeerId, tuple[str, int], bytes], Awaitable[None] | None]
STATE_FILE = "node.json"
ITEMS_FILE = "items.sqlite3"
KEY_FILE = "node.key"
MAX_PEER_PAGES = 64
MAX_PAGE_SOURCES = 3
"""Replicas a topic's follow-up pages are read from (the closest that said "more"): every
replica already sent its first page during the lookup, and reading all of the rest from all
twenty multiplied a big swarm's membership traffic by twenty. Three keep a withholding or
failing replica from hiding entries that the others hold."""
MAX_ENTRY_ADDRS = 64  # BEP 5 addresses a krpc-mode get_peers asks for their own entries
MAX_VALUES_PER_SOURCE = 8
"""BEP 5 addresses from one responder's answer that a listing contacts (issue 34: one
KRPC node's 200 unsigned values had made a reader send ~78x that answer's bytes to
addresses it chose)."""
SILENT_S = 600.0
"""Seconds an address from BEP 5 values that did not answer is left alone."""
MAX_SILENT = 4096
MAX_OWN = 16  # entries one address may answer with (itself and the browser tabs it hosts)
MAX_OWN_TOPICS = 64
DEAD_FOR = 60.0


def _not_here(name: str, instead: str):
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise DHTError(f"{name} is kademlia's unsigned or pickle-based API; use {instead}")
    return refuse


def node_id_of(public_key: bytes) -> bytes:
    """The DHT node id a fresh node derives from its peer key (a saved one is kept)."""
    return hashlib.sha1(b"swarm-dht-node\x00" + public_key).digest()


class DHTNode(Server):
    """One DHT node. ``await listen()``, ``await bootstrap([...])``, use, ``await stop()``.

    ``read_only`` (BEP 43, :mod:`dht.protocol`): for a process that only looks or writes
    for a few seconds (``swarm status``, a one-shot submit, ``swarm dht get``): its queries
    say so, other nodes never list it as a contact, and it answers no queries, so it leaves
    no dead contact behind. Its own store is then nobody's copy: a write must land on
    another node. Never for a member or a ``swarm dht serve`` node, which others must reach.
    """

    protocol_class = DHTProtocol

    def __init__(self, key: PeerKey | None = None, data_dir: Path | None = None, *,
                 ksize: int = 20, alpha: int = 3,
                 validators: Validators | dict[bytes, Validator] | None = None,
                 rpc_timeout: float = 5.0, slow_after: float | None = None,
                 item_ttl: float = ITEM_TTL,
                 republish_interval: float = 3600.0, maintenance_interval: float = 60.0,
                 token_rotate: float = 300.0, max_items: int = MAX_ITEMS,
                 max_per_topic: int = MAX_PER_TOPIC, krpc: bool = False,
                 require_bep42: bool = False, read_only: bool = False) -> None:
        self.data_dir = Path(data_dir) if data_dir is not None else None
        if self.data_dir is not None:
            self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if key is None:
            key = (PeerKey.load_or_create(self.data_dir / KEY_FILE) if self.data_dir
                   else PeerKey.generate())
        self.key = key
        node_id, self._saved_neighbours = self._load_state()
        if node_id is None:
            node_id = node_id_of(key.public_bytes)
        self.validators = (validators if isinstance(validators, Validators)
                           else Validators(validators))
        self.store = ItemStore(self.data_dir / ITEMS_FILE if self.data_dir else None,
                               self.validators, item_ttl=item_ttl, max_items=max_items,
                               max_per_topic=max_per_topic)
        super().__init__(ksize=ksize, alpha=alpha, node_id=node_id, storage=self.store)
        self.rpc_timeout = rpc_timeout
        self.krpc = krpc
        self.read_only = read_only
        self.require_bep42 = require_bep42
        self.slow_after = slow_after
        self.republish_interval = republish_interval
        self.maintenance_interval = maintenance_interval
        self.tokens = TokenIssuer(token_rotate, now=self.clock())
        self.replay = ReplayGuard()
        self.stats = Stats()
        self._callbacks: list[MessageCallback] = []
        self._bootstrap_addrs: list[tuple[str, int]] = []
        self._tasks: set[asyncio.Task] = set()
        self._maintenance: asyncio.Task | None = None
        self._address: tuple[str, int] | None = None
        self._stopped = False
        self._dead: dict[bytes, float] = {}
        self._own: dict[bytes, dict[PeerId, Announcement]] = {}  # see own_announcements
        self._keys_at: dict[tuple[str, int], tuple[PeerId, ...]] = {}  # see _entries_at
        self._silent: dict[tuple[str, int], float] = {}  # BEP 5 values that never answered
        self.external = ExternalAddress()

    clock = staticmethod(time.time)

    # kademlia.Server's own API stores unsigned values, trusts the most common one and
    # pickles its state: none of it is reachable through a DHTNode.
    get = _not_here("get", "get_mutable or get_immutable")
    set = _not_here("set", "put_mutable or put_immutable")
    set_digest = _not_here("set_digest", "put_mutable or put_immutable")
    save_state = _not_here("save_state", "data_dir (state is saved as JSON)")
    save_state_regularly = _not_here("save_state_regularly", "data_dir")
    load_state = staticmethod(_not_here("load_state", "DHTNode(data_dir=...)"))
    refresh_table = _not_here("refresh_table", "maintain_once")

    def __repr__(self) -> str:
        return f"DHTNode({self.peer_id.short()} at {self._address})"

    @property
    def peer_id(self) -> PeerId:
        return self.key.peer_id

    @property
    def node_id(self) -> bytes:
        """The 20-byte Kademlia id."""
        return self.node.id

    @property
    def address(self) -> tuple[str, int]:
        if self._address is None:
            raise DHTError("not listening")
        return self._address

    def met_mainline(self, addr: tuple[str, int]) -> None:
        """A node answered only in KRPC: we live among mainline nodes, so from now on this
        node asks unknown addresses in KRPC and keeps topics there too (KRPC mode)."""
        if not self.krpc:
            log.info("%s:%d speaks only KRPC: joining the mainline DHT", *addr)
            self.krpc = True

    def note_external(self, reporter: tuple[str, int], seen: str) -> None:
        """A KRPC answer from ``reporter`` said it sees us at ``seen`` (BEP 42). When the
        vote settles on a public IP our id is not bound to, take a BEP 42 id for it: mainline
        nodes that enforce BEP 42 ignore a node whose id does not match its address."""
        ip = self.external.note(reporter, seen)
        if ip is None or is_local(ip) or bep42_valid(ip, self.node.id):
            return
        self._set_node_id(bep42_id(ip))
        log.info("external address %s: new BEP 42 node id %s", ip, self.node.id.hex())

    def _set_node_id(self, node_id: bytes) -> None:
        """Change our Kademlia id in place (the Node object is shared by the protocol and
        the routing table); buckets are laid out around the id, so contacts are re-added."""
        contacts = self.protocol.router.contacts()
        self.node.id = node_id
        self.node.long_id = int(node_id.hex(), 16)
        router = NearestRoutingTable(self.protocol, self.ksize, self.node)
        router.require_bep42 = self.require_bep42
        self.protocol.router = router
        self.protocol.core.own_id = node_id
        for contact in contacts:
            router.add_contact(contact)
        self._save_state()

    def _create_protocol(self) -> DHTProtocol:
        return DHTProtocol(self)

    # -- lifecycle --------------------------------------------------------------------------

    async def listen(self, port: int = 0, host: str = "127.0.0.1") -> int:  # type: ignore[override]
        """Bind the UDP socket; returns the real port (``port=0`` picks a free one)."""
        if self.transport is not None:
            raise DHTError("already listening")
        loop = asyncio.get_running_loop()
        self.transport, self.protocol = await loop.create_datagram_endpoint(
            self._create_protocol, local_addr=(host, port))
        sockname = self.transport.get_extra_info("sockname")
        self._address = (sockname[0], sockname[1])
        self._maintenance = asyncio.create_task(self._maintain())
        return self._address[1]

    async def bootstrap(self, addrs: Iterable[tuple[str, int]] = ()) -> int:  # type: ignore[override]
        """Join through ``addrs`` and the neighbours saved in the data dir.

        Returns the number of routing contacts. Raises :class:`LookupFailed` when ``addrs``
        were given and none of them (nor a saved neighbour) answered.
        """
        self._require_listening()
        addrs = [(str(h), int(p)) for h, p in addrs]
        self._bootstrap_addrs = addrs
        wanted = list(dict.fromkeys(addrs + self._saved_neighbours))
        resolved = await asyncio.gather(*(self._resolve(a) for a in wanted))
        targets = [a for a in dict.fromkeys(r for r in resolved if r) if a != self._address]
        seeds = await self._ping_seeds(targets)
        if not seeds:
            if addrs:
                raise LookupFailed(f"no bootstrap node answered ({len(targets)} tried)")
            return 0
        await self._lookup(self.node.id, partial(self._q_find_node, target=self.node.id),
                           seeds=seeds)
        self._save_state()
        return len(self.protocol.router.contacts())

    async def stop(self) -> None:  # type: ignore[override]
        """Save state, cancel background work and close the socket. Safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        tasks = list(self._tasks) + ([self._maintenance] if self._maintenance else [])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.protocol is not None:
            self._save_state()
            self.protocol.stop()
        if self.transport is not None:
            self.transport.close()
        self.store.close()

    async def settle(self) -> None:
        """Wait for background writes (write-back to stale nodes) started so far."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def _require_listening(self) -> None:
        if self.protocol is None or self._stopped:
            raise DHTError("the node is not listening (call listen() first)")

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Run ``coro`` in the background; :meth:`settle` waits for it, a failure is logged."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("background task failed: %r", task.exception())

    @staticmethod
    async def _resolve(addr: tuple[str, int]) -> tuple[str, int] | None:
        host, port = addr
        try:
            ipaddress.ip_address(host)
            return host, port
        except ValueError:
            pass
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, family=socket.AF_INET, type=socket.SOCK_DGRAM)
        except OSError as exc:
            log.warning("cannot resolve %s: %s", host, exc)
            return None
        return (infos[0][4][0], port) if infos else None

    async def _ping_seeds(self, targets: list[tuple[str, int]]) -> list[Node]:
        """Ping the bootstrap targets; the nodes that answered. Once one has answered, the
        others get the lookup's grace for a slow node; those still silent then (a member
        that a data dir remembers, dead since) go on in the background, and a late answer
        still joins the routing table. Waiting them out cost every start (each ``swarm
        status`` after a member died) a whole RPC timeout."""
        tasks = [asyncio.ensure_future(self._ping_addr(a)) for a in targets]
        await self._first_answer_then_grace(tasks)
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()
        return [t.result() for t in tasks if _answered(t)]

    async def answering(self, addrs: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
        """The addresses in ``addrs`` whose DHT node answers a ping, in the order given.
        Once one has answered, the others get the lookup's grace for a slow node; one still
        silent then counts as not answering (its ping goes on in the background). A member
        that died since it announced (a SIGKILLed coordinator) held every ``swarm status``
        for the whole RPC timeout."""
        self._require_listening()
        addrs = [(str(h), int(p)) for h, p in addrs]
        tasks = [asyncio.ensure_future(self._ping_addr(a)) for a in addrs]
        await self._first_answer_then_grace(tasks)
        return [a for a, t in zip(addrs, tasks, strict=True) if _answered(t)]

    async def _first_answer_then_grace(self, tasks: list[asyncio.Task]) -> None:
        """Wait until one of ``tasks`` answers (a result other than None), then the others
        for ``GRACE`` times a slow answer's time; those still running go on in the background
        (a dead peer's RPC timeout holds no caller). Cancelled, it cancels them all."""
        pending = set(tasks)
        try:
            while pending and not any(_answered(t) for t in tasks):
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if pending:
                _, pending = await asyncio.wait(pending, timeout=GRACE * self._slow_after())
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            raise
        for task in pending:
            self.spawn(task)

    async def _ping_addr(self, addr: tuple[str, int]) -> Node | None:
        ok, data = await self.protocol.ping_any(addr)
        if not ok or not is_node_id(data) or data == self.node.id:
            return None
        node = Node(data, addr[0], addr[1])
        self.protocol.welcome_if_new(node)
        return node

    # -- persistence ------------------------------------------------------------------------

    def _load_state(self) -> tuple[bytes | None, list[tuple[str, int]]]:
        if self.data_dir is None or not (self.data_dir / STATE_FILE).exists():
            return None, []
        try:
            state = json.loads((self.data_dir / STATE_FILE).read_text())
            node_id = bytes.fromhex(state["node_id"])
            neighbours = [(str(h), int(p)) for h, p in state.get("neighbours", [])]
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable %s: %s", self.data_dir / STATE_FILE, exc)
            return None, []
        return (node_id if is_node_id(node_id) else None), neighbours

    def _save_state(self) -> None:
        if self.data_dir is None or self.protocol is None:
            return
        neighbours = [[n.ip, n.port] for n in self.protocol.router.find_neighbors(self.node)]
        if not neighbours:
            neighbours = [list(a) for a in self._saved_neighbours]
        state = {"node_id": self.node.id.hex(), "neighbours": neighbours}
        # not secret, but private: the neighbours say whom this peer talks to
        write_private(self.data_dir / STATE_FILE, json.dumps(state, indent=1).encode())

    # -- lookups ------------------------------------------------------------------------------

    async def _lookup(self, target: bytes, query, seeds: list[Node] | None = None
                      ) -> LookupResult:
        self._require_listening()
        if seeds is None:
            seeds = self.protocol.router.find_neighbors(Node(target), self.ksize)
        result = await lookup(target, seeds, query, k=self.ksize, alpha=self.alpha,
                              own_id=self.node.id, skip=self._recently_failed(),
                              slow_after=self._slow_after(), keep=self.spawn,
                              admit=self._admit if self.require_bep42 else None)
        self.stats.lookups += 1
        self.stats.lookup_rpcs += result.rpcs
        return result

    @staticmethod
    def _admit(node: Node) -> bool:
        """BEP 42: a public contact's id must be bound to its IP (local ones are exempt)."""
        return bep42_valid(node.ip, node.id)

    def _slow_after(self) -> float:
        """A fixed ``slow_after``, else SRTT + 4 RTTVAR of this node's requests, kept
        between 50 ms and a quarter of the RPC timeout."""
        if self.slow_after is not None:
            return self.slow_after
        return self.protocol.rtt.slow_after(0.05, self.rpc_timeout / 4)

    def _recently_failed(self) -> set[bytes]:
        """Nodes that timed out in the last DEAD_FOR seconds: other nodes may still list
        them, and asking again would cost a timeout per lookup."""
        now = self.clock()
        for nid in [nid for nid, at in self._dead.items() if now - at > DEAD_FOR]:
            del self._dead[nid]
        return set(self._dead)

    def note_failed(self, node: Node) -> None:
        self._dead[node.id] = self.clock()

    def note_gone(self, address: tuple[str, int], node_id: bytes | None = None) -> int:
        """A peer the caller has its own reason to think dead (a coordinator whose heartbeats
        stopped) listens at ``address`` (its node id ``node_id``, when known): lookups stop
        asking it for :data:`DEAD_FOR` s, as if it had timed out. Without this, each lookup
        that met the dead node waited out its grace (up to ``rpc_timeout``), and a failover
        claim of three lookups in a row could outlast the claim deadline. Returns the
        contacts dropped from the routing table."""
        now = self.clock()
        if node_id is not None:
            self._dead[node_id] = now
        if self.protocol is None:  # not listening: no contacts yet
            return 0
        known = self.protocol.router.by_address(address)  # one contact per source
        if known is None:
            return 0
        self._dead[known.id] = now
        self.protocol.router.remove_contact(known)
        return 1

    def forget_failures(self) -> None:
        """Ask again the nodes that timed out lately (lookups skip them for :data:`DEAD_FOR`
        s): for a caller about to retry a read that came back empty, whose holders may have
        been busy rather than gone."""
        self._dead.clear()

    def note_alive(self, node: Node) -> None:
        self._dead.pop(node.id, None)

    async def _q_find_node(self, node: Node, target: bytes):
        data = await self.protocol.call(node, "find_node", target)
        if data is None:
            return None
        return parse_nodes(data), None

    async def _q_get(self, node: Node, target: bytes, salt: bytes = b""):
        data = await self.protocol.call(node, "get", target)
        if data is None:
            return None
        if not isinstance(data, dict) or reply_error(data):
            return [], GetReply(None, [])
        token = data.get("token")
        reply = GetReply(token if isinstance(token, bytes) and len(token) <= 32 else None,
                         parse_nodes(data.get("nodes")))
        if "m" in data:
            try:
                wire = list(data["m"]) if isinstance(data["m"], list | tuple) else data["m"]
                if isinstance(wire, list) and len(wire) == 5 and wire[1] is None:
                    wire[1] = salt  # a KRPC answer: BEP 44 leaves the salt to the asker
                item = mutable_from_wire(wire)
                if item.target != target:
                    raise ItemError(errors.PROTOCOL, "item for another target")
                self.validators.check(item)
                reply.mutable = item
            except ItemError as exc:
                log.debug("dropping an invalid item from %s: %s", node, exc)
        elif "i" in data:
            value = data["i"]
            if isinstance(value, bytes) and hashlib.sha1(value).digest() == target:
                reply.immutable = value
        return reply.nodes, reply

    async def _q_peers(self, node: Node, topic: bytes, after: bytes = b""):
        data = await self.protocol.call(node, "get_peers", topic, after)
        if data is None:
            return None
        if not isinstance(data, dict) or reply_error(data):
            return [], PeersReply(None, [])
        token = data.get("token")
        reply = PeersReply(token if isinstance(token, bytes) and len(token) <= 32 else None,
                           parse_nodes(data.get("nodes")), more=data.get("more") is True)
        raw = data.get("peers")
        for entry in raw[:MAX_PER_TOPIC] if isinstance(raw, list | tuple) else []:
            try:
                reply.peers.append(announcement_from_wire(topic, entry))
            except (ItemError, ValueError):
                log.debug("dropping a forged or malformed announcement from %s", node)
        return reply.nodes, reply

    def _self_is_close(self, target: bytes, responses: list[tuple[Node, Any]]) -> bool:
        """Whether this node belongs among the k closest to ``target`` that answered (never
        a read-only node: nobody asks it)."""
        if self.read_only:
            return False
        if len(responses) < self.ksize:
            return True
        t = int.from_bytes(target, "big")
        return (self.node.long_id ^ t) < (responses[-1][0].long_id ^ t)

    async def _send_writes(self, writes: list[tuple[Node, str, tuple]]) -> tuple[int, list]:
        """Send (node, request, args) writes; (number accepted, list of refusals).

        Once some node has answered, the others get the lookup's grace for a slow node; one
        still silent then (it answered the lookup and has died since) stops holding the
        write: its request runs on in the background, and its timeout still marks it dead.
        Waiting it out cost a whole RPC timeout per write.
        """
        async def one(node: Node, name: str, args: tuple) -> bool | ItemError | None:
            data = await self.protocol.call(node, name, *args)
            if data is None:
                return None
            err = reply_error(data)
            if err is not None:
                return err
            return isinstance(data, dict) and data.get("ok") is True

        tasks = [asyncio.ensure_future(one(n, name, a)) for n, name, a in writes]
        await self._first_answer_then_grace(tasks)
        results = [t.result() for t in tasks if t.done()]
        refusals = [r for r in results if isinstance(r, ItemError)]
        return sum(r is True for r in results), refusals

    def _settle(self, accepted: int, refusals: list[ItemError], responders: int,
                local: Callable[[], None] | None) -> None:
        """Decide a write's outcome; store locally first when ``local`` is given."""
        local_error: ItemError | None = None
        if local is not None:
            try:
                local()
                if not responders:
                    return  # a lone node (or the only one left): its own store is the DHT
            except ItemError as exc:
                local_error = exc
        if accepted:
            return
        if refusals:
            code = Counter(r.code for r in refusals).most_common(1)[0][0]
            raise next(r for r in refusals if r.code == code)
        if local_error is not None:
            raise local_error
        raise LookupFailed("no node accepted the write")

    # -- mutable items ------------------------------------------------------------------------

    async def get_mutable(self, pubkey: bytes, salt: bytes = b"") -> MutableItem | None:
        """The valid item with the highest seq among the k closest responders (and this
        node), or None. Responders holding an older one (or none) are sent the newest."""
        salt = check_salt(bytes(salt))
        target = mutable_target(pubkey, salt)
        res = await self._lookup(target, partial(self._q_get, target=target, salt=salt))
        now = self.clock()
        local = self.store.get_mutable(target, now)
        found = [r.mutable for _, r in res.responses if r.mutable is not None]
        if local is not None:
            found.append(local)
        if not found:
            return None
        best = max(found, key=lambda i: i.seq)
        stale = [(n, "put", (r.token, "m", mutable_to_wire(best), None))
                 for n, r in res.responses
                 if r.token and (r.mutable is None or r.mutable.seq < best.seq)]
        if stale:
            self.spawn(self._send_writes(stale))
        if (local is None or local.seq < best.seq) and self._self_is_close(target,
                                                                           res.responses):
            self._store_quietly(partial(self.store.put_mutable, best, None, now))
        return best

    async def put_mutable(self, private_key: PeerKey | Signer, value: object, salt: bytes = b"",
                          seq: int | None = None, cas: int | None = None) -> MutableItem:
        """Sign and store ``value``; ``seq=None`` means one more than the newest found.

        Raises :class:`ItemError` (301 when ``cas`` is not the newest seq, 302 when ``seq``
        is not higher than what nodes hold, 205/207 for size limits, or a validator's code)
        or :class:`LookupFailed` when no node took it.
        """
        salt = check_salt(bytes(salt))
        target = mutable_target(public_bytes_of(private_key), salt)
        res = await self._lookup(target, partial(self._q_get, target=target, salt=salt))
        now = self.clock()
        found = [r.mutable for _, r in res.responses if r.mutable is not None]
        local = self.store.get_mutable(target, now)
        if local is not None:
            found.append(local)
        newest = max(found, key=lambda i: i.seq, default=None)
        if seq is None:
            seq = newest.seq + 1 if newest is not None else 1
        item = MutableItem.create(private_key, value, seq, salt)
        self.validators.check(item)
        # BEP 44's rules against the newest copy found, not just against each node's copy:
        # a node that never held the item would otherwise accept a stale seq.
        decide_mutable_store(newest, item, cas)
        await self._write_mutable(item, cas, res, now)
        self.store.remember_published(Published(target, item, None),
                                      now + self.republish_interval)
        return item

    async def _write_mutable(self, item: MutableItem, cas: int | None, res: LookupResult,
                             now: float) -> None:
        writes = [(n, "put", (r.token, "m", mutable_to_wire(item), cas))
                  for n, r in res.responses if r.token]
        accepted, refusals = await self._send_writes(writes)
        local = (partial(self.store.put_mutable, item, cas, now)
                 if self._self_is_close(item.target, res.responses) else None)
        self._settle(accepted, refusals, len(res.responses), local)

    def _store_quietly(self, put: Callable[[], Any]) -> None:
        try:
            put()
        except ItemError as exc:
            log.debug("not keeping a copy: %s", exc)

    # -- immutable items ----------------------------------------------------------------------

    def hold_immutable(self, value: object) -> bytes:
        """Keep ``value`` in this node's own store now (no I/O); its target. A peer told of
        it asks us first (:meth:`get_immutable_from`) while :meth:`put_immutable` spreads
        it, which can take a lookup's grace for each node that died since it was listed."""
        encoded = encode_value(value)
        return self.store.put_immutable(encoded, self.clock())

    async def get_immutable_from(self, address: tuple[str, int], target: bytes) -> Value | None:
        """The value under ``target`` asked of the node at ``address`` alone (a peer that
        just named it to us holds it), checked against the hash; None when that node is no
        contact of ours or does not have it (then ask the DHT: :meth:`get_immutable`)."""
        if not is_node_id(target):
            raise ValueError("target must be 20 bytes")
        local = self.store.get_immutable(target, self.clock())
        if local is not None:
            return bdecode(local)
        self._require_listening()
        node = self.protocol.router.by_address(tuple(address))
        answer = await self._q_get(node, target=target) if node is not None else None
        if answer is None or answer[1].immutable is None:
            return None
        return bdecode(answer[1].immutable)

    async def put_immutable(self, value: object) -> bytes:
        """Store ``value`` (bencodable, <= 1000 bytes encoded) under its hash; the target."""
        encoded = encode_value(value)
        target = hashlib.sha1(encoded).digest()
        res = await self._lookup(target, partial(self._q_get, target=target))
        await self._write_immutable(target, encoded, res)
        self.store.remember_published(Published(target, None, encoded),
                                      self.clock() + self.republish_interval)
        return target

    async def _write_immutable(self, target: bytes, encoded: bytes, res: LookupResult) -> None:
        writes = [(n, "put", (r.token, "i", encoded, None)) for n, r in res.responses if r.token]
        accepted, refusals = await self._send_writes(writes)
        now = self.clock()
        local = (partial(self.store.put_immutable, encoded, now)
                 if self._self_is_close(target, res.responses) else None)
        self._settle(accepted, refusals, len(res.responses), local)

    async def get_immutable(self, target: bytes) -> Value | None:
        """The value stored under ``target`` (checked against the hash), or None."""
        if not is_node_id(target):
            raise ValueError("target must be 20 bytes")
        local = self.store.get_immutable(target, self.clock())
        if local is not None:
            return bdecode(local)
        res = await self._lookup(target, partial(self._q_get, target=target))
        value = next((r.immutable for _, r in res.responses if r.immutable is not None), None)
        if value is None:
            return None
        missing = [(n, "put", (r.token, "i", value, None)) for n, r in res.responses
                   if r.token and r.immutable is None]
        if missing:
            self.spawn(self._send_writes(missing))
        if self._self_is_close(target, res.responses):
            self._store_quietly(partial(self.store.put_immutable, value, self.clock()))
        return bdecode(value)

    # -- announcements ------------------------------------------------------------------------

    async def announce(self, topic: bytes, record: bytes, ttl: float = 600.0) -> Announcement:
        """Publish this peer's own signed entry under ``topic`` for ``ttl`` seconds.

        A later announcement replaces the earlier one (it must expire later). Re-announce
        before ``ttl`` runs out to stay listed.
        """
        check_topic(topic)
        if not 0 < ttl <= MAX_TTL:
            raise ValueError(f"ttl must be in (0, {MAX_TTL}] seconds")
        ann = Announcement.create(self.key, self.peer_id, topic, bytes(record),
                                  self.clock() + ttl)
        await self.publish_announcement(topic, ann)
        return ann

    async def publish_announcement(self, topic: bytes, ann: Announcement) -> None:
        """Store an entry another peer signed (a browser tab this node serves: the tab
        cannot speak UDP, so its host carries the tab's own signed entry).

        Among mainline nodes (KRPC mode) the closest swarm nodes keep the entry itself, the
        mainline ones this node's address under the topic's info-hash (BEP 5; readers then
        ask us for our entries), and our own entry also goes out as our BEP 44 item."""
        ann.check(check_topic(topic))
        if not ann.expires_at - MAX_TTL <= self.clock() < ann.expires_at:
            raise ValueError("announcement is expired or expires too far ahead")
        self._keep_own(topic, ann)
        target = topic_target(topic)
        res = await self._lookup(target, partial(self._topic_query(), topic=topic))
        now = self.clock()
        wire = announcement_to_wire(ann)
        writes = [(n, "announce_peer", (r.token, target, self.address[1]))
                  if self.protocol.speaks_swarm((n.ip, n.port)) is False
                  else (n, "announce", (r.token, topic, wire))
                  for n, r in res.responses if r.token]
        accepted, refusals = await self._send_writes(writes)
        local = (partial(self.store.announce, topic, ann, now)
                 if self._self_is_close(target, res.responses) else None)
        if self.krpc and ann.peer_id == self.peer_id:
            await self._put_entry(topic, ann)
        self._settle(accepted, refusals, len(res.responses), local)

    def _keep_own(self, topic: bytes, ann: Announcement) -> None:
        now = self.clock()
        for t in [t for t, e in self._own.items() if all(a.expires_at <= now
                                                          for a in e.values())]:
            del self._own[t]
        if topic not in self._own and len(self._own) >= MAX_OWN_TOPICS:
            raise ValueError(f"this node already announces under {MAX_OWN_TOPICS} topics")
        entries = self._own.setdefault(topic, {})
        entries[ann.peer_id] = ann
        if len(entries) > MAX_OWN:
            del entries[min(entries, key=lambda p: entries[p].expires_at)]

    def own_announcements(self, topic: bytes, now: float) -> list[Announcement]:
        """The live entries this node published under ``topic`` (its own, its tabs')."""
        return [a for a in self._own.get(topic, {}).values() if a.expires_at > now]

    async def _put_entry(self, topic: bytes, ann: Announcement) -> None:
        try:
            await self.put_mutable(self.key, entry_value(ann), salt=topic,
                                   seq=int(ann.expires_at * 1000))
        except (ItemError, LookupFailed) as exc:
            log.info("no BEP 44 copy of our entry under %r: %s", topic[:20], exc)

    def _topic_query(self):
        return self._q_topic if self.krpc else self._q_peers

    async def _q_topic(self, node: Node, topic: bytes):
        """A topic lookup step among mainline nodes: a swarm node is asked for the entries
        it holds, a mainline node (or one not known yet) for BEP 5 peers under the topic's
        info-hash; a swarm node met that way is then asked for its entries too."""
        addr = (node.ip, node.port)
        if self.protocol.speaks_swarm(addr):
            return await self._q_peers(node, topic)
        got = await self._q_bep5(node, topic_target(topic))
        if got is None:
            return None
        nodes, found = got
        if self.protocol.speaks_swarm(addr):
            native = await self._q_peers(node, topic)
            if native is not None:
                native[1].values = found.values
                return native
        return nodes, PeersReply(found.token, nodes, values=found.values)

    async def _entries_at(self, addr: tuple[str, int], topic: bytes) -> list[Announcement]:
        """The entries the swarm node at ``addr`` (found under the topic's info-hash)
        publishes; when it does not answer, the BEP 44 copies of the peers it answered
        for last time."""
        if self.protocol.speaks_swarm(addr) is False:
            return []
        ok, data = await self.protocol.request(
            addr, "own", topic, unproven=self.protocol.speaks_swarm(addr) is None)
        if not ok and self.protocol.speaks_swarm(addr) is None:
            self._silent.pop(addr, None)     # never answered anything: leave it alone
            self._silent[addr] = self.clock()
            while len(self._silent) > MAX_SILENT:
                self._silent.pop(next(iter(self._silent)))
        if ok and isinstance(data, dict) and reply_error(data) is None:
            raw = data.get("peers")
            entries = []
            for wire in raw[:MAX_OWN] if isinstance(raw, list | tuple) else []:
                try:
                    entries.append(announcement_from_wire(topic, wire))
                except (ItemError, ValueError):
                    log.debug("dropping a forged or malformed entry from %s", addr)
            self._keys_at.pop(addr, None)
            self._keys_at[addr] = tuple(a.peer_id for a in entries)
            while len(self._keys_at) > 4096:
                self._keys_at.pop(next(iter(self._keys_at)))
            return entries
        got = await asyncio.gather(*(self._get_entry(topic, p)
                                     for p in self._keys_at.get(addr, ())))
        return [a for a in got if a is not None]

    async def _get_entry(self, topic: bytes, peer: PeerId) -> Announcement | None:
        try:
            item = await self.get_mutable(peer.raw, topic)
            return entry_from_value(topic, item.pubkey, item.value) if item else None
        except DHTError as exc:
            log.debug("no BEP 44 entry of %s: %s", peer.short(), exc)
            return None

    async def get_peers(self, topic: bytes) -> list[Announcement]:
        """Every live, validly signed entry under ``topic`` (newest per peer), by peer id."""
        check_topic(topic)
        target = topic_target(topic)
        self.stats.listings += 1
        res = await self._lookup(target, partial(self._topic_query(), topic=topic))
        best: dict[PeerId, Announcement] = {}
        now = self.clock()

        def merge(entries: Iterable[Announcement]) -> None:
            for a in entries:
                cur = best.get(a.peer_id)
                if a.expires_at > now and (cur is None or a.expires_at > cur.expires_at):
                    best[a.peer_id] = a

        async def rest_of(node: Node, reply: PeersReply) -> None:
            pages = 0
            while reply.more and reply.peers and pages < MAX_PEER_PAGES:
                answer = await self._q_peers(node, topic, reply.peers[-1].peer_id.raw)
                if answer is None:
                    return
                reply = answer[1]
                merge(reply.peers)
                pages += 1

        for _, reply in res.responses:
            merge(reply.peers)
        more = [(n, r) for n, r in res.responses if r.more][:MAX_PAGE_SOURCES]
        await asyncio.gather(*(rest_of(n, r) for n, r in more))
        if self.krpc:
            addrs = dict.fromkeys(v for _, r in res.responses
                                  for v in r.values[:MAX_VALUES_PER_SOURCE])
            addrs.update(dict.fromkeys(self.store.peers(target, now)))
            addrs.pop(self.address, None)
            for addr in [a for a in addrs if self._silent.get(a, -SILENT_S) > now - SILENT_S]:
                del addrs[addr]
            for found in await asyncio.gather(*(self._entries_at(a, topic) for a in
                                                list(addrs)[:MAX_ENTRY_ADDRS])):
                merge(found)
            merge(self.own_announcements(topic, now))
        merge(self.store.get_peers(topic, now))
        return sorted(best.values(), key=lambda a: a.peer_id)

    # -- BEP 5 peers (mainline announce_peer / get_peers) --------------------------------------

    async def _q_bep5(self, node: Node, info_hash: bytes):
        data = await self.protocol.call(node, "peers", info_hash)
        if data is None:
            return None
        if not isinstance(data, dict) or reply_error(data):
            return [], PeerValues(None, [])
        token = data.get("token")
        values = []
        for v in data.get("values") or []:
            if (isinstance(v, list | tuple) and len(v) == 2 and isinstance(v[0], str)
                    and isinstance(v[1], int) and 0 < v[1] < 65536):
                values.append((v[0], v[1]))
        return parse_nodes(data.get("nodes")), PeerValues(
            token if isinstance(token, bytes) and len(token) <= 32 else None, values[:200])

    async def announce_peer(self, info_hash: bytes, port: int) -> int:
        """BEP 5: list this host at ``port`` under ``info_hash`` on the nodes closest to it
        (mainline nodes included: this is how a swarm is found on the public DHT). Returns
        how many nodes took it; raises :class:`LookupFailed` when none did."""
        if not is_node_id(info_hash):
            raise ValueError("info_hash must be 20 bytes")
        if not 0 < port < 65536:
            raise ValueError("port must be 1..65535")
        res = await self._lookup(info_hash, partial(self._q_bep5, info_hash=info_hash))
        writes = [(n, "announce_peer", (r.token, info_hash, port))
                  for n, r in res.responses if r.token]
        accepted, refusals = await self._send_writes(writes)
        local = (partial(self.store.add_peer, info_hash, self.address[0], port, self.clock())
                 if self._self_is_close(info_hash, res.responses) else None)
        self._settle(accepted, refusals, len(res.responses), local)
        return accepted

    async def find_peers(self, info_hash: bytes) -> list[tuple[str, int]]:
        """BEP 5: every ``(ip, port)`` announced under ``info_hash`` that the closest nodes
        (and this one) hold. Unsigned by design: check each peer yourself."""
        if not is_node_id(info_hash):
            raise ValueError("info_hash must be 20 bytes")
        res = await self._lookup(info_hash, partial(self._q_bep5, info_hash=info_hash))
        found = dict.fromkeys(v for _, r in res.responses for v in r.values)
        found.update(dict.fromkeys(self.store.peers(info_hash, self.clock())))
        return list(found)

    # -- messages -----------------------------------------------------------------------------

    def on_message(self, callback: MessageCallback) -> MessageCallback:
        """Call ``callback(sender, addr, payload)`` (sync or async) for each message."""
        self._callbacks.append(callback)
        return callback

    def deliver(self, sender: PeerId, addr: tuple[str, int], payload: bytes) -> None:
        """Hand a verified message to the callbacks (the protocol calls this)."""
        for callback in self._callbacks:
            try:
                result = callback(sender, addr, payload)
                if inspect.isawaitable(result):
                    self.spawn(result)
            except Exception:
                log.exception("message callback failed")

    async def send_message(self, addr: tuple[str, int], payload: bytes) -> None:
        """Send ``payload`` (<= 4 KiB) to the node at ``addr``, signed by this node's key.

        Raises :class:`PeerUnreachable` without a reply, :class:`MessageRefused` when the
        peer refuses it, :class:`MessageTooLarge` (also a ValueError) for a bigger payload.
        """
        self._require_listening()
        payload = bytes(payload)
        if len(payload) > MAX_PAYLOAD:
            raise MessageTooLarge(f"payload is {len(payload)} bytes; at most {MAX_PAYLOAD}")
        addr = (str(addr[0]), int(addr[1]))
        known = self.protocol.router.by_address(addr)
        for attempt in range(2):
            if known is None or attempt:
                known = await self._ping_addr(addr)
                if known is None:
                    raise PeerUnreachable(f"no DHT node answered at {addr[0]}:{addr[1]}")
            env = Envelope.seal(self.key, self.peer_id, known.id, payload, self.clock())
            ok, data = await self.protocol.request(addr, "message", env.to_wire())
            if not ok:
                raise PeerUnreachable(f"no reply from {addr[0]}:{addr[1]}")
            err = reply_error(data)
            if err is None:
                return
            if err.code != errors.PROTOCOL or "another node" not in err.message:
                raise MessageRefused(err.code, err.message)
        raise MessageRefused(err.code, err.message)

    # -- validators -----------------------------------------------------------------------------

    def register_validator(self, salt_prefix: bytes, fn: Validator) -> None:
        """Refuse (on store and on get) items whose salt starts with ``salt_prefix`` unless
        ``fn(item)`` returns without raising :class:`ItemError`."""
        self.validators.register(salt_prefix, fn)

    # -- maintenance --------------------------------------------------------------------------

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(self.maintenance_interval)
            try:
                await self.maintain_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("DHT maintenance failed")

    async def maintain_once(self) -> None:
        """Expire items, re-put what this node published, refresh buckets, save state."""
        now = self.clock()
        self.store.expire(now)
        for pub in self.store.due_published(now):
            await self._republish(pub)
        router = self.protocol.router
        if not router.contacts():
            if self._bootstrap_addrs or self._saved_neighbours:
                try:
                    await self.bootstrap(self._bootstrap_addrs)
                except LookupFailed as exc:
                    log.info("rejoin failed: %s", exc)
        else:
            for rid in self.protocol.get_refresh_ids():
                await self._lookup(rid, partial(self._q_find_node, target=rid))
        self._save_state()

    async def _republish(self, pub: Published) -> None:
        now = self.clock()
        try:
            salt = pub.mutable.salt if pub.mutable is not None else b""
            res = await self._lookup(pub.target,
                                     partial(self._q_get, target=pub.target, salt=salt))
            if pub.mutable is not None:
                await self._write_mutable(pub.mutable, None, res, now)
            else:
                await self._write_immutable(pub.target, pub.immutable, res)
        except ItemError as exc:
            if exc.code in (errors.SEQ_TOO_LOW, errors.CAS_MISMATCH):
                log.info("item %s was superseded; no longer re-putting it", pub.target.hex())
                self.store.forget_published(pub.target)
                return
            log.warning("re-put of %s refused: %s", pub.target.hex(), exc)
        except LookupFailed as exc:
            log.info("re-put of %s failed: %s", pub.target.hex(), exc)
        self.store.remember_published(pub, now + self.republish_interval)


def _answered(task: asyncio.Task) -> bool:
    """Whether ``task`` finished with a result other than None."""
    return task.done() and not task.cancelled() and task.exception() is None \
        and task.result() is not None
