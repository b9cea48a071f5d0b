"""dht: a Kademlia DHT (on the ``kademlia`` package) holding BEP 44 signed items.

Usable without the rest of swarm.

Exceptions (all in :mod:`dht.errors`)::

    DHTError                   base of everything this package raises on purpose
    +-- BencodeError           bytes that are not one canonical bencoded value (also ValueError)
    +-- ItemError              an invalid or refused item; ``.code`` is BEP 44's error number
                               (203 protocol, 205 value too big, 206 bad signature,
                               207 salt too big, 301 CAS mismatch, 302 seq lower than stored)
    +-- LookupFailed           no responder had a valid value, or the network is unreachable
    +-- PeerUnreachable        a direct request (send_message) got no reply in time
    +-- MessageRefused         the peer refused a message (forged, replayed, too big); ``.code``
"""

from dht.announce import Announcement, topic_target
from dht.bencode import bdecode, bencode
from dht.errors import (
    BencodeError,
    DHTError,
    ItemError,
    LookupFailed,
    MessageRefused,
    PeerUnreachable,
)
from dht.items import (
    MutableItem,
    immutable_target,
    mutable_target,
    signature_buffer,
    verify_mutable,
)
from dht.node import DHTNode

__all__ = [
    "Announcement",
    "BencodeError",
    "DHTError",
    "DHTNode",
    "ItemError",
    "LookupFailed",
    "MessageRefused",
    "MutableItem",
    "PeerUnreachable",
    "bdecode",
    "bencode",
    "immutable_target",
    "mutable_target",
    "signature_buffer",
    "topic_target",
    "verify_mutable",
]
