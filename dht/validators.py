"""Pluggable record validators per key namespace (hivemind's idea).

A validator is ``fn(item: MutableItem) -> None`` that raises :class:`ItemError` to refuse.
Every node runs the validators whose salt prefix matches an item, both when it stores the item
and when a lookup returns it, so e.g. a swarm charter without a valid owner proof is refused
network-wide and never returned by an honest node.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from dht import errors
from dht.errors import ItemError
from dht.items import MutableItem

Validator = Callable[[MutableItem], None]
log = logging.getLogger(__name__)


class Validators:
    """Validators keyed by salt prefix; all whose prefix matches an item's salt run."""

    def __init__(self, initial: Mapping[bytes, Validator] | Iterable[tuple[bytes, Validator]]
                 | None = None) -> None:
        self._by_prefix: list[tuple[bytes, Validator]] = []
        pairs = initial.items() if isinstance(initial, Mapping) else (initial or ())
        for prefix, fn in pairs:
            self.register(prefix, fn)

    def register(self, salt_prefix: bytes, fn: Validator) -> None:
        if not isinstance(salt_prefix, bytes):
            raise TypeError("salt_prefix must be bytes")
        if not callable(fn):
            raise TypeError("a validator must be callable")
        self._by_prefix.append((salt_prefix, fn))

    def check(self, item: MutableItem) -> None:
        """Raise :class:`ItemError` if any matching validator refuses ``item``."""
        for prefix, fn in self._by_prefix:
            if not item.salt.startswith(prefix):
                continue
            try:
                fn(item)
            except ItemError:
                raise
            except Exception as exc:  # a buggy validator refuses; it never crashes the node
                log.warning("validator for prefix %r raised %r", prefix, exc)
                raise ItemError(errors.GENERIC, f"refused by validator: {exc}") from exc
