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
    +-- MessageRefused         the peer refused a message (forged, replayed, stale); ``.code``
    +-- MessageTooLarge        a message payload over 4 KiB (also ValueError); nothing sent

Use::

    node = DHTNode(key, data_dir)            # key: identity.PeerKey (generated when None)
    port = await node.listen(0)              # the real bound port
    await node.bootstrap([("203.0.113.5", 6881)])
    item = await node.put_mutable(key, {b"term": 3}, salt=b"state")   # seq = newest + 1
    item = await node.get_mutable(key.public_bytes, salt=b"state")    # highest valid seq
    await node.announce(b"swarm-id", msgpack_record, ttl=600)
    peers = await node.get_peers(b"swarm-id")                         # [Announcement]
    node.on_message(lambda sender, addr, payload: ...)
    await node.send_message(peer_addr, b"offer...")
    await node.stop()
"""

from dht.announce import Announcement, topic_target
from dht.bencode import bdecode, bencode
from dht.errors import (
    BencodeError,
    DHTError,
    ItemError,
    LookupFailed,
    MessageRefused,
    MessageTooLarge,
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
    "MessageTooLarge",
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
