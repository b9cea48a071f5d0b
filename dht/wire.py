"""The RPC wire: request names, reply shapes, and checks on everything a peer sends back.

Requests ride on rpcudp (``b"\\x00" + id + msgpack([name, args])``), which refuses to send one
whose msgpack part exceeds 8192 bytes: the largest here (a 4 KiB message, a 1000-byte item
with its key, salt and signature) stay well under it. Every reply is a msgpack
map; a refusal is ``{"error": [code, message]}`` with BEP 44 / BEP 5 numbers. Parsers here
turn untrusted replies into typed values or None, never an exception.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from kademlia.node import Node

from dht import errors
from dht.announce import Announcement
from dht.errors import ItemError
from dht.items import MutableItem

ID_LEN = 20

# name -> number of arguments after the sender's node id
REQUESTS = {
    "ping": 0,
    "find_node": 1,  # target
    "get": 1,  # target
    "put": 4,  # token, kind ("m"/"i"), item, cas
    "get_peers": 2,  # topic, after
    "announce": 3,  # token, topic, entry
    "message": 1,  # envelope
    "peers": 1,  # info-hash (BEP 5 get_peers)
    "announce_peer": 3,  # token, info-hash, port (BEP 5)
    "own": 1,  # topic: the answering node's own entries under it (found by BEP 5 address)
}
# requests whose reply can be large: one from an address that has not completed a round trip
# gets {"retry": token} instead, and the same request again with the token appended (one
# more argument) gets the full reply (see dht.addresses.RoundTrips)
RETRYABLE = ("find_node", "get", "get_peers", "peers", "own")
# requests that have a KRPC form (a node in KRPC mode sends these as KRPC queries)
KRPC_FORMS = ("ping", "find_node", "get", "put", "peers", "announce_peer")


def error_reply(code: int, message: str) -> dict:
    return {"error": [code, message[:200]]}


def reply_error(reply: object) -> ItemError | None:
    """The refusal carried by ``reply``, if it is one."""
    if isinstance(reply, dict) and "error" in reply:
        err = reply["error"]
        if (isinstance(err, list | tuple) and len(err) == 2 and isinstance(err[0], int)
                and isinstance(err[1], str)):
            return ItemError(err[0], err[1])
        return ItemError(errors.PROTOCOL, "malformed error reply")
    return None


def is_node_id(value: object) -> bool:
    return isinstance(value, bytes) and len(value) == ID_LEN


def node_to_wire(n: Node) -> list:
    return [n.id, n.ip, n.port]


def parse_nodes(value: object, limit: int = 64) -> list[Node]:
    """Contacts from a reply; malformed entries are skipped."""
    out: list[Node] = []
    if not isinstance(value, list | tuple):
        return out
    for entry in value[:limit]:
        if not isinstance(entry, list | tuple) or len(entry) != 3:
            continue
        nid, ip, port = entry
        if not is_node_id(nid) or not isinstance(ip, str) or not isinstance(port, int):
            continue
        if not 0 < port < 65536:
            continue
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            continue
        out.append(Node(nid, ip, port))
    return out


def mutable_to_wire(item: MutableItem) -> list:
    return [item.pubkey, item.salt, item.seq, item.encoded_value, item.signature]


def mutable_from_wire(value: object) -> MutableItem:
    if not isinstance(value, list | tuple) or len(value) != 5:
        raise ItemError(errors.PROTOCOL, "mutable item must be a 5-element list")
    return MutableItem.from_wire(*value)


def announcement_to_wire(ann: Announcement) -> list:
    return [ann.peer_id.raw, ann.record, ann.expires_at, ann.signature]


def announcement_from_wire(topic: bytes, value: object) -> Announcement:
    if not isinstance(value, list | tuple) or len(value) != 4:
        raise ItemError(errors.PROTOCOL, "announcement must be a 4-element list")
    return Announcement.from_wire(topic, *value)


@dataclass
class GetReply:
    """A checked reply to ``get``."""

    token: bytes | None
    """Write token for this target from this node."""
    nodes: list[Node]
    """Closer contacts it offered."""
    mutable: MutableItem | None = None
    """Its mutable item, if it had a valid one (signature, target and validators checked)."""
    immutable: bytes | None = None
    """Its immutable value (bencoded), if it had one whose hash matches the target."""


@dataclass
class PeersReply:
    """A checked page of ``get_peers``."""

    token: bytes | None
    """Write token for this topic from this node."""
    nodes: list[Node]
    """Closer contacts it offered."""
    peers: list[Announcement] = field(default_factory=list)
    """Valid entries on this page (forged ones are dropped)."""
    more: bool = False
    """Whether a next page exists (ask again with ``after`` = the last peer id)."""
    values: list[tuple[str, int]] = field(default_factory=list)
    """BEP 5 peers under the topic's info-hash (from a mainline node, which holds no
    announcements: each is asked for its own entries)."""


@dataclass
class PeerValues:
    """A checked reply to a BEP 5 ``get_peers`` (``peers`` in the swarm framing)."""

    token: bytes | None
    """Write token for this info-hash from this node."""
    values: list[tuple[str, int]] = field(default_factory=list)
    """Peers it holds under the info-hash."""
