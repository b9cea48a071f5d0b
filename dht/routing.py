"""kademlia's routing table, bounded as Kademlia defines it, with an exact nearest-k.

- Only the bucket holding this node's own id is ever split, so there are at most 160 buckets
  of ``ksize`` contacts (kademlia's extra "depth % 5" splits let crafted ids grow the table
  without bound: 8.4k pings made 14,750 buckets and ~12 ms per request).
- One contact per source (:func:`dht.addresses.source_key`: a public IP, or a local
  ``host:port``): a socket that claims many ids keeps the first, so it cannot fill the slots
  near a key. A full bucket liveness-checks its oldest contact (one check in flight per
  bucket) and keeps newcomers as replacements.
- With ``require_bep42`` a contact at a public address must have a BEP 42 id for it.
- ``find_neighbors``: ``kademlia.routing.RoutingTable.find_neighbors`` walks buckets with
  ``TableTraverser``, which can stop early and return [] from a non-empty table; a plain
  nearest-k over every bucket (at most 160 * k contacts) is cheap and always right.
"""

from __future__ import annotations

import heapq

from kademlia.node import Node
from kademlia.routing import RoutingTable

from dht.addresses import bep42_valid, node_source

MAX_BUCKETS = 160


class NearestRoutingTable(RoutingTable):
    require_bep42 = False  # refuse public contacts whose id is not bound to their IP

    def flush(self) -> None:
        super().flush()
        self._sources: dict[str, bytes] = {}  # source -> the id it holds a slot under
        self._checking: set[int] = set()  # bucket lower bounds with a liveness ping in flight

    def add_contact(self, node: Node) -> None:
        if node.id == self.node.id:
            return
        if self.require_bep42 and not bep42_valid(node.ip, node.id):
            return
        src = node_source(node)
        held = self._sources.get(src)
        if held is not None and held != node.id:
            return  # this source already has a slot under another id
        while True:
            index = self.get_bucket_for(node)
            bucket = self.buckets[index]
            if bucket.add_node(node):
                self._sources[src] = node.id
                return
            if bucket.has_in_range(self.node) and len(self.buckets) < MAX_BUCKETS:
                self.split_bucket(index)
                continue
            self._check_head(bucket)
            return

    def split_bucket(self, index: int) -> None:
        super().split_bucket(index)  # kademlia moves replacements into the two halves too
        for bucket in self.buckets[index:index + 2]:
            for nid, n in list(bucket.nodes.items()):
                if self._sources.setdefault(node_source(n), nid) != nid:
                    del bucket.nodes[nid]

    def _check_head(self, bucket) -> None:
        lower = bucket.range[0]
        if lower in self._checking or self.protocol is None:
            return
        self._checking.add(lower)
        head = bucket.head()

        async def ping() -> None:
            try:
                await self.protocol.call_ping(head)
            finally:
                self._checking.discard(lower)

        coro = ping()
        try:
            self.protocol.dht.spawn(coro)  # the node's tasks: logged, settled, stopped
        except RuntimeError:  # no running loop (a table used outside a node)
            coro.close()
            self._checking.discard(lower)

    def remove_contact(self, node: Node) -> None:
        bucket = self.buckets[self.get_bucket_for(node)]
        was = bucket.nodes.get(node.id)
        before = set(bucket.nodes)
        bucket.remove_node(node)
        if was is not None:
            self._sources.pop(node_source(was), None)
        for nid in set(bucket.nodes) - before:  # a replacement took the slot
            n = bucket.nodes[nid]
            src = node_source(n)
            if self._sources.setdefault(src, nid) != nid:
                del bucket.nodes[nid]  # its source already holds another slot

    def find_neighbors(self, node: Node, k: int | None = None,
                       exclude: Node | None = None) -> list[Node]:
        k = k or self.ksize
        # as kademlia's traverser did: a lookup near a bucket keeps it from counting as lonely
        self.buckets[self.get_bucket_for(node)].touch_last_updated()
        candidates = (
            n for bucket in self.buckets for n in bucket.nodes.values()
            if n.id != node.id and (exclude is None or not n.same_home_as(exclude))
        )
        return heapq.nsmallest(k, candidates, key=node.distance_to)

    def contacts(self) -> list[Node]:
        return [n for bucket in self.buckets for n in bucket.nodes.values()]

    def by_address(self, addr: tuple[str, int]) -> Node | None:
        for n in self.contacts():
            if (n.ip, n.port) == tuple(addr):
                return n
        return None
