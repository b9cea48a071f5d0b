"""dht: a Kademlia DHT (on the ``kademlia`` package) holding BEP 44 signed items.

Usable without the rest of swarm.

Exceptions (all in :mod:`dht.errors`)::

    DHTError                   base of everything this package raises on purpose
    +-- ItemError              a BEP 44 item is invalid; ``.code`` is BEP 44's error number
                               (205 value too big, 206 bad signature, 207 salt too big,
                               301 CAS mismatch, 302 seq lower than stored)
    +-- LookupFailed           no responder had a valid value, or the network is unreachable
"""

from dht.errors import DHTError, ItemError, LookupFailed

__all__ = ["DHTError", "ItemError", "LookupFailed"]
