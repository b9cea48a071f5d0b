"""The DHT's request handlers as a sans-IO core, shared by both codecs on the socket.

:class:`RequestCore` is fed decoded, typed requests, the sender's address and ``now``, and
returns typed answers (or raises :class:`ItemError` with a BEP 44 / BEP 5 code). It owns the
rules -- write tokens, store quotas, BEP 44 seq/CAS, signed messages -- and nothing else: no
socket, no clock, no codec. :mod:`dht.protocol` (the swarm msgpack framing) and
:mod:`dht.krpc` (BitTorrent's KRPC) decode a datagram, call one method here and encode the
answer, so a mainline node and a swarm node are answered by the same code.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

from kademlia.node import Node

from dht import errors
from dht.addresses import source_key
from dht.announce import Announcement, check_topic, topic_target
from dht.bencode import bdecode
from dht.errors import BencodeError, ItemError
from dht.items import MAX_VALUE, MutableItem, check_seq
from dht.messages import Envelope, ReplayGuard
from dht.store import ItemStore
from dht.tokens import TokenIssuer
from identity import PeerId

Addr = tuple[str, int]
PEERS_PAGE_BYTES = 7000  # announcements per topic page, so a reply stays one small datagram


@dataclass
class GetAnswer:
    """Answer to a BEP 44 ``get``."""

    token: bytes
    """Write token for (sender, target)."""
    nodes: list[Node]
    """The closest contacts this node knows."""
    mutable: MutableItem | None = None
    """The stored mutable item (left out when the asker already has this seq or newer)."""
    immutable: bytes | None = None
    """The stored immutable value, bencoded."""


@dataclass
class PeersAnswer:
    """Answer to a BEP 5 ``get_peers``."""

    token: bytes
    """Write token for (sender, info-hash)."""
    nodes: list[Node]
    """The closest contacts this node knows."""
    values: list[Addr] = field(default_factory=list)
    """Peers announced under the info-hash."""


@dataclass
class TopicAnswer:
    """Answer to a swarm ``get_peers`` (signed announcements under a topic), one page."""

    token: bytes
    """Write token for (sender, topic target)."""
    nodes: list[Node]
    """The closest contacts this node knows."""
    page: list[Announcement]
    """Entries with peer id above the asked ``after``, in peer id order."""
    more: bool
    """Whether another page follows."""


def check_target(value: object) -> bytes:
    if not isinstance(value, bytes) or len(value) != 20:
        raise ItemError(errors.PROTOCOL, "target must be 20 bytes")
    return value


def check_immutable(encoded: object) -> bytes:
    """A bencoded immutable value as a peer sent it; raises :class:`ItemError`."""
    if not isinstance(encoded, bytes) or len(encoded) > MAX_VALUE:
        raise ItemError(errors.VALUE_TOO_BIG, "immutable value must be <= 1000 bytes")
    try:
        bdecode(encoded)
    except BencodeError as exc:
        raise ItemError(errors.PROTOCOL, f"value is not canonical bencode: {exc}") from exc
    return encoded


class RequestCore:
    """One node's answers to requests; fed ``now``, holds no I/O."""

    def __init__(self, own_id: bytes, store: ItemStore, tokens: TokenIssuer,
                 replay: ReplayGuard, nodes_near: Callable[[bytes, Addr], list[Node]],
                 deliver: Callable[[PeerId, Addr, bytes], None],
                 own: Callable[[bytes, float], list[Announcement]] = lambda t, now: []
                 ) -> None:
        self.own_id = own_id
        self.store = store
        self.tokens = tokens
        self.replay = replay
        self.nodes_near = nodes_near
        self.deliver = deliver
        self._own = own

    def _check_token(self, token: object, sender: Addr, target: bytes, now: float) -> None:
        if not self.tokens.check(token, sender, target, now):
            raise ItemError(errors.PROTOCOL, "bad or expired write token")

    def find_node(self, sender: Addr, target: object, now: float) -> list[Node]:
        return self.nodes_near(check_target(target), sender)

    def get(self, sender: Addr, target: object, now: float, seq: int | None = None
            ) -> GetAnswer:
        """BEP 44 get: the item under ``target``; a mutable one only if newer than ``seq``."""
        target = check_target(target)
        answer = GetAnswer(self.tokens.issue(sender, target, now),
                           self.nodes_near(target, sender))
        item = self.store.get_mutable(target, now)
        if item is not None:
            if seq is None or item.seq > seq:
                answer.mutable = item
        else:
            answer.immutable = self.store.get_immutable(target, now)
        return answer

    def put_mutable(self, sender: Addr, token: object, item: MutableItem, cas: object,
                    now: float) -> None:
        if cas is not None:
            check_seq(cas)
        self._check_token(token, sender, item.target, now)
        self.store.put_mutable(item, cas, now, source_key(sender))

    def put_immutable(self, sender: Addr, token: object, encoded: object, now: float) -> None:
        encoded = check_immutable(encoded)
        self._check_token(token, sender, hashlib.sha1(encoded).digest(), now)
        self.store.put_immutable(encoded, now, source_key(sender))

    def get_peers(self, sender: Addr, info_hash: object, now: float) -> PeersAnswer:
        """BEP 5 get_peers."""
        info_hash = check_target(info_hash)
        return PeersAnswer(self.tokens.issue(sender, info_hash, now),
                           self.nodes_near(info_hash, sender),
                           self.store.peers(info_hash, now))

    def announce_peer(self, sender: Addr, token: object, info_hash: object, port: int,
                      now: float) -> None:
        """BEP 5 announce_peer: ``sender``'s IP with ``port`` becomes a peer of the hash."""
        info_hash = check_target(info_hash)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ItemError(errors.PROTOCOL, "port must be 1..65535")
        self._check_token(token, sender, info_hash, now)
        self.store.add_peer(info_hash, sender[0], port, now, source_key(sender))

    def get_topic(self, sender: Addr, topic: object, after: object, now: float
                  ) -> TopicAnswer:
        """One page of the signed announcements under a swarm topic."""
        topic = check_topic(topic)
        if not isinstance(after, bytes) or len(after) > 32:
            raise ItemError(errors.PROTOCOL, "after must be at most 32 bytes")
        target = topic_target(topic)
        entries = self.store.get_peers(topic, now, after)
        page: list[Announcement] = []
        size = 0
        for ann in entries:
            cost = len(ann.record) + 128
            if page and size + cost > PEERS_PAGE_BYTES:
                break
            page.append(ann)
            size += cost
        return TopicAnswer(self.tokens.issue(sender, target, now),
                           self.nodes_near(target, sender), page, len(page) < len(entries))

    def announce(self, sender: Addr, token: object, topic: object, ann_of: Callable[
            [bytes], Announcement], now: float) -> None:
        """Keep a signed announcement (``ann_of(topic)`` decodes and checks it)."""
        topic = check_topic(topic)
        self._check_token(token, sender, topic_target(topic), now)
        self.store.announce(topic, ann_of(topic), now, source_key(sender))

    def own(self, sender: Addr, topic: object, now: float) -> list[Announcement]:
        """This node's own live entries under a topic: a reader that found our address
        under the topic's BEP 5 info-hash (on mainline nodes, which hold no entries) asks
        us for them; each is signed, so the reader checks it, not us."""
        return self._own(check_topic(topic), now)

    def message(self, sender: Addr, env: Envelope, now: float) -> None:
        """A signed message for this node: checked against replays, then delivered."""
        peer = self.replay.admit(env, self.own_id, now)
        self.deliver(peer, sender, env.payload)
