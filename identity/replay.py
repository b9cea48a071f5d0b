"""One replay window for signed, nonce-carrying messages (sans-IO, fed ``now``).

Below everything that takes signed messages from peers: the DHT's authenticated datagrams
(:class:`dht.messages.ReplayGuard`), WebRTC signaling (:func:`swarm.links.signaling.open_signal`)
and circuit hellos (:mod:`swarm.links.circuit`). Each checks its own signature and addressing
first, then asks :class:`NonceWindow` whether the (sender, nonce) is fresh.
"""

from __future__ import annotations

from collections import OrderedDict


class Replayed(Exception):
    """A message outside the clock window, or one this window saw (or can no longer tell
    apart from one it saw). The adapters turn it into their own error type."""


class NonceWindow:
    """Accepts each (sender, nonce) once, within ``window_s`` of the local clock.

    Remembered nonces are bounded per sender (``max_per_sender``) and in total
    (``max_entries``), and a full table never refuses anyone (invariant 8): a sender over its
    quota forgets its own oldest nonce and raises its *floor* -- any message of its sent at or
    before the floor is refused as a possible replay. A full table forgets the least recently
    active sender whole and raises a global floor the same way. So a flooding key costs only
    itself, and a flood of fresh keys delays nobody whose clock is within the churn time.
    """

    def __init__(self, window_s: float, max_entries: int = 100_000,
                 max_per_sender: int | None = None) -> None:
        self.window_s = window_s
        self.max_entries = max_entries
        self.max_per_sender = min(max_entries, max_per_sender if max_per_sender is not None
                                  else max(16, max_entries // 64))
        # sender -> nonce -> (sent_at, seen_at), in arrival order; senders by last activity
        self._seen: OrderedDict[bytes, OrderedDict[bytes, tuple[float, float]]] = OrderedDict()
        self._floor: dict[bytes, float] = {}
        self._global_floor = float("-inf")
        self._total = 0
        self._admits = 0

    def __len__(self) -> int:
        return self._total

    def check_time(self, sent_at: float, now: float) -> None:
        """Raise :class:`Replayed` when ``sent_at`` is more than ``window_s`` from ``now``
        (NaN too): cheap, so callers run it before verifying a signature."""
        if not abs(now - sent_at) <= self.window_s:
            raise Replayed(f"timestamp is {now - sent_at:+.0f} s off, outside the accepted "
                           f"window of {self.window_s:g} s: stale or replayed")

    def admit(self, sender: bytes, nonce: bytes, sent_at: float, now: float) -> None:
        """Remember a validly signed message, or raise :class:`Replayed`."""
        self.check_time(sent_at, now)
        self._admits += 1
        if self._admits % max(1, self.max_entries // 4) == 0:
            self._sweep(now)
        nonces = self._seen.get(sender)
        if nonces is not None:
            self._expire_sender(sender, now)
            nonces = self._seen.get(sender)
        if nonce in (nonces or ()):
            raise Replayed("nonce seen before: replayed")
        if sent_at <= max(self._global_floor, self._floor.get(sender, float("-inf"))):
            raise Replayed("replayed or reordered (older than what this node can still "
                           "tell apart)")
        if nonces is None:
            nonces = self._seen[sender] = OrderedDict()
        self._seen.move_to_end(sender)
        if len(nonces) >= self.max_per_sender:
            _, (oldest, _) = nonces.popitem(last=False)
            self._floor[sender] = max(self._floor.get(sender, oldest), oldest)
            self._total -= 1
        while self._total >= self.max_entries:
            self._forget_quietest(sender)
        nonces[nonce] = (sent_at, now)
        self._total += 1

    def _forget_quietest(self, keep: bytes) -> None:
        victim = next(s for s in self._seen if s != keep)
        nonces = self._seen.pop(victim)
        floor = max([sent for sent, _ in nonces.values()] + [self._floor.pop(victim, -1e300)])
        self._global_floor = max(self._global_floor, floor)
        self._total -= len(nonces)

    def _expire_sender(self, sender: bytes, now: float) -> None:
        # A nonce seen more than 2 windows ago can no longer pass the window check.
        nonces = self._seen[sender]
        while nonces:
            nonce, (_, seen_at) = next(iter(nonces.items()))
            if now - seen_at <= 2 * self.window_s:
                break
            del nonces[nonce]
            self._total -= 1
        if not nonces:
            del self._seen[sender]
            self._floor.pop(sender, None)

    def _sweep(self, now: float) -> None:
        for sender in list(self._seen):
            self._expire_sender(sender, now)
