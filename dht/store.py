"""What one node holds: BEP 44 items, announcements and the items it publishes, in SQLite.

The rules (BEP 44 seq/CAS, validators, expiry, per-topic bounds) live here and take ``now``
as an argument, so they are tested without sockets or clocks. ``path=None`` keeps everything
in memory; a file path makes it survive restarts (stdlib ``sqlite3``; values are stored
bencoded and re-verified when read back, so a tampered file cannot inject items).
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from dht import errors
from dht.announce import MAX_TTL, Announcement
from dht.errors import ItemError
from dht.items import MAX_VALUE, MutableItem, decide_mutable_store
from dht.validators import Validators

log = logging.getLogger(__name__)

ITEM_TTL = 2 * 3600.0
MAX_ITEMS = 100_000
MAX_PER_TOPIC = 256

_SCHEMA = """
CREATE TABLE IF NOT EXISTS mutable (
    target BLOB PRIMARY KEY, pubkey BLOB, salt BLOB, seq INTEGER, value BLOB, sig BLOB,
    expires_at REAL);
CREATE TABLE IF NOT EXISTS immutable (target BLOB PRIMARY KEY, value BLOB, expires_at REAL);
CREATE TABLE IF NOT EXISTS announcements (
    topic BLOB, peer BLOB, record BLOB, expires_at REAL, sig BLOB, drop_at REAL,
    PRIMARY KEY (topic, peer));
CREATE TABLE IF NOT EXISTS published (
    target BLOB PRIMARY KEY, kind TEXT, pubkey BLOB, salt BLOB, seq INTEGER, value BLOB,
    sig BLOB, next_put REAL);
"""


@dataclass(frozen=True, slots=True)
class Published:
    """An item this node put and re-puts until it expires from the publisher's interest."""

    target: bytes
    """Where the item lives."""
    mutable: MutableItem | None
    """The signed item, for a mutable put."""
    immutable: bytes | None
    """The bencoded value, for an immutable put."""


class ItemStore:
    """One node's items and announcements with BEP 44's store rules."""

    def __init__(self, path: Path | None = None, validators: Validators | None = None, *,
                 item_ttl: float = ITEM_TTL, max_items: int = MAX_ITEMS,
                 max_per_topic: int = MAX_PER_TOPIC) -> None:
        self.validators = validators or Validators()
        self.item_ttl = item_ttl
        self.max_items = max_items
        self.max_per_topic = max_per_topic
        self._db = sqlite3.connect(str(path) if path else ":memory:", isolation_level=None)
        if path:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def _count(self) -> int:
        row = self._db.execute(
            "SELECT (SELECT COUNT(*) FROM mutable) + (SELECT COUNT(*) FROM immutable)").fetchone()
        return int(row[0])

    def _room_for_one_more(self) -> None:
        if self._count() >= self.max_items:
            raise ItemError(errors.SERVER, "this node's store is full")

    # -- mutable ------------------------------------------------------------------------

    def get_mutable(self, target: bytes, now: float) -> MutableItem | None:
        row = self._db.execute(
            "SELECT pubkey, salt, seq, value, sig FROM mutable WHERE target=? AND expires_at>?",
            (target, now)).fetchone()
        if row is None:
            return None
        try:
            item = MutableItem.from_wire(*row)
            self.validators.check(item)
        except ItemError as exc:
            log.warning("dropping stored item %s: %s", target.hex(), exc)
            self._db.execute("DELETE FROM mutable WHERE target=?", (target,))
            return None
        return item

    def put_mutable(self, item: MutableItem, cas: int | None, now: float) -> None:
        """Store or refresh ``item`` (already signature-checked); raises :class:`ItemError`."""
        self.validators.check(item)
        stored = self.get_mutable(item.target, now)
        if stored is None:
            self._room_for_one_more()
        expires = now + self.item_ttl
        if decide_mutable_store(stored, item, cas):
            self._db.execute(
                "INSERT OR REPLACE INTO mutable VALUES (?,?,?,?,?,?,?)",
                (item.target, item.pubkey, item.salt, item.seq, item.encoded_value,
                 item.signature, expires))
        else:
            self._db.execute("UPDATE mutable SET expires_at=? WHERE target=?",
                             (expires, item.target))

    # -- immutable ----------------------------------------------------------------------

    def get_immutable(self, target: bytes, now: float) -> bytes | None:
        """The bencoded value stored under ``target``, checked against its hash."""
        row = self._db.execute("SELECT value FROM immutable WHERE target=? AND expires_at>?",
                               (target, now)).fetchone()
        if row is None or hashlib.sha1(row[0]).digest() != target:
            return None
        return bytes(row[0])

    def put_immutable(self, encoded: bytes, now: float) -> bytes:
        if len(encoded) > MAX_VALUE:
            raise ItemError(errors.VALUE_TOO_BIG, f"value is {len(encoded)} bytes; at most 1000")
        target = hashlib.sha1(encoded).digest()
        if self.get_immutable(target, now) is None:
            self._room_for_one_more()
        self._db.execute("INSERT OR REPLACE INTO immutable VALUES (?,?,?)",
                         (target, encoded, now + self.item_ttl))
        return target

    # -- announcements ------------------------------------------------------------------

    def announce(self, topic: bytes, ann: Announcement, now: float) -> None:
        """Keep ``ann`` (already checked) as its peer's entry under ``topic``."""
        if ann.expires_at <= now:
            raise ItemError(errors.PROTOCOL, "announcement already expired")
        row = self._db.execute(
            "SELECT expires_at FROM announcements WHERE topic=? AND peer=? AND drop_at>?",
            (topic, ann.peer_id.raw, now)).fetchone()
        if row is not None and ann.expires_at < row[0]:
            raise ItemError(errors.SEQ_TOO_LOW, "an entry expiring later is already stored")
        if row is None:
            (count,) = self._db.execute(
                "SELECT COUNT(*) FROM announcements WHERE topic=? AND drop_at>?",
                (topic, now)).fetchone()
            if count >= self.max_per_topic:
                raise ItemError(errors.SERVER, "topic is full on this node")
        self._db.execute(
            "INSERT OR REPLACE INTO announcements VALUES (?,?,?,?,?,?)",
            (topic, ann.peer_id.raw, ann.record, ann.expires_at, ann.signature,
             min(ann.expires_at, now + MAX_TTL)))

    def get_peers(self, topic: bytes, now: float, after: bytes = b"",
                  limit: int = MAX_PER_TOPIC) -> list[Announcement]:
        """Live entries under ``topic`` with peer id > ``after``, in peer id order."""
        rows = self._db.execute(
            "SELECT peer, record, expires_at, sig FROM announcements "
            "WHERE topic=? AND drop_at>? AND peer>? ORDER BY peer LIMIT ?",
            (topic, now, after, limit)).fetchall()
        out = []
        for peer, record, expires_at, sig in rows:
            try:
                out.append(Announcement.from_wire(topic, peer, record, expires_at, sig))
            except ItemError:
                self._db.execute("DELETE FROM announcements WHERE topic=? AND peer=?",
                                 (topic, peer))
        return out

    # -- expiry and publishing ------------------------------------------------------------

    def expire(self, now: float) -> int:
        """Forget everything past its expiry; returns how many rows went."""
        n = 0
        for table, column in (("mutable", "expires_at"), ("immutable", "expires_at"),
                              ("announcements", "drop_at")):
            n += self._db.execute(f"DELETE FROM {table} WHERE {column}<=?", (now,)).rowcount
        return n

    def counts(self) -> dict[str, int]:
        return {t: self._db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                for t in ("mutable", "immutable", "announcements", "published")}

    def remember_published(self, pub: Published, next_put: float) -> None:
        m = pub.mutable
        if m is not None:
            row = (pub.target, "m", m.pubkey, m.salt, m.seq, m.encoded_value, m.signature)
        else:
            row = (pub.target, "i", None, None, None, pub.immutable, None)
        self._db.execute("INSERT OR REPLACE INTO published VALUES (?,?,?,?,?,?,?,?)",
                         (*row, next_put))

    def forget_published(self, target: bytes) -> None:
        self._db.execute("DELETE FROM published WHERE target=?", (target,))

    def due_published(self, now: float) -> list[Published]:
        rows = self._db.execute(
            "SELECT target, kind, pubkey, salt, seq, value, sig FROM published "
            "WHERE next_put<=?", (now,)).fetchall()
        out = []
        for target, kind, pubkey, salt, seq, value, sig in rows:
            try:
                if kind == "m":
                    out.append(Published(target, MutableItem.from_wire(pubkey, salt, seq, value,
                                                                        sig), None))
                else:
                    out.append(Published(target, None, bytes(value)))
            except ItemError:
                self.forget_published(target)
        return out
