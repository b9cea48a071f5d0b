"""What one node holds: BEP 44 items, announcements and the items it publishes, in SQLite.

The rules (BEP 44 seq/CAS, validators, expiry, quotas) live here and take ``now`` as an
argument, so they are tested without sockets or clocks.

Quotas (invariant 8): every row (mutable, immutable, announcement) counts against
``max_items``; each row remembers the *source* that stored it (see
:func:`dht.addresses.source_key`). One source holds at most ``max_per_source`` rows, one
public key at most ``max_per_key`` mutable items, one source at most
``max_per_source_topic`` entries of a topic. A full store or topic evicts from the source
holding the most (nearest expiry first) when that source holds more than the newcomer's, so a
flood from one source costs honest writers nothing; only when sources are even does a write
get "full" (202). Rows this node stores for itself (source ``""``) are counted but never
evicted for another source.

``path=None`` keeps everything in memory; a file path makes it survive restarts (stdlib
``sqlite3``; values are stored bencoded and re-verified when read back, so a tampered file
cannot inject items).
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
MAX_PER_TOPIC = 2048
"""Entries one node keeps per topic: a swarm of a thousand members has its whole list on
every replica (at 256, no node held a complete list past 256 members)."""
MAX_PER_SOURCE_TOPIC = 16
"""Entries of one topic one source (address) may have stored here: filling a topic takes
``MAX_PER_TOPIC / 16`` addresses, and evictions hit the source holding the most."""
MAX_PER_KEY = 256
SELF = ""  # the source of rows this node stores for itself
_TABLES = (("mutable", "expires_at"), ("immutable", "expires_at"), ("announcements", "drop_at"),
           ("peers", "expires_at"))
PEER_TTL = 30 * 60.0  # BEP 5 peers: mainline nodes keep them about this long
MAX_VALUES = 50  # BEP 5 peers per get_peers reply (fits one datagram)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS mutable (
    target BLOB PRIMARY KEY, pubkey BLOB, salt BLOB, seq INTEGER, value BLOB, sig BLOB,
    expires_at REAL, source TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS immutable (target BLOB PRIMARY KEY, value BLOB, expires_at REAL,
    source TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS announcements (
    topic BLOB, peer BLOB, record BLOB, expires_at REAL, sig BLOB, drop_at REAL,
    source TEXT NOT NULL DEFAULT '', PRIMARY KEY (topic, peer));
CREATE TABLE IF NOT EXISTS peers (
    info_hash BLOB, ip TEXT, port INTEGER, expires_at REAL, source TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (info_hash, ip, port));
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
                 max_per_topic: int = MAX_PER_TOPIC, max_per_source: int | None = None,
                 max_per_key: int = MAX_PER_KEY,
                 max_per_source_topic: int | None = None) -> None:
        self.validators = validators or Validators()
        self.item_ttl = item_ttl
        self.max_items = max_items
        self.max_per_topic = max_per_topic
        self.max_per_source = (max_per_source if max_per_source is not None
                               else max(16, max_items // 64))
        self.max_per_key = max_per_key
        self.max_per_source_topic = (max_per_source_topic if max_per_source_topic is not None
                                     else min(MAX_PER_SOURCE_TOPIC, max_per_topic))
        self._db = sqlite3.connect(str(path) if path else ":memory:", isolation_level=None)
        if path:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        for table, _ in _TABLES:  # files written before quotas existed
            columns = [r[1] for r in self._db.execute(f"PRAGMA table_info({table})")]
            if "source" not in columns:
                self._db.execute(
                    f"ALTER TABLE {table} ADD COLUMN source TEXT NOT NULL DEFAULT ''")
        self._db.executescript(
            "CREATE INDEX IF NOT EXISTS mutable_source ON mutable(source);"
            "CREATE INDEX IF NOT EXISTS mutable_pubkey ON mutable(pubkey);"
            "CREATE INDEX IF NOT EXISTS immutable_source ON immutable(source);"
            "CREATE INDEX IF NOT EXISTS announcements_source ON announcements(source);"
            "CREATE INDEX IF NOT EXISTS peers_source ON peers(source);")

    def close(self) -> None:
        self._db.close()

    def _count(self, source: str | None = None) -> int:
        where, args = ("WHERE source=?", (source,)) if source is not None else ("", ())
        return sum(self._db.execute(f"SELECT COUNT(*) FROM {t} {where}", args).fetchone()[0]
                   for t, _ in _TABLES)

    def _evict_one(self, table: str, where: str, args: tuple, source: str) -> bool:
        """``table`` is one table or ``"*"`` (all, for the total cap). Drop the row nearest expiry of the source holding the most rows under ``where``,
        if it holds more than ``source`` does (+1, so two even sources do not trade places).
        Rows of this node itself are never evicted for another source."""
        tables = [table] if table != "*" else [t for t, _ in _TABLES]
        union = " UNION ALL ".join(f"SELECT source FROM {t} {where}" for t in tables)
        rows = self._db.execute(f"SELECT source, COUNT(*) c FROM ({union}) WHERE source != '' "
                                "GROUP BY source ORDER BY c DESC LIMIT 1",
                                args * len(tables)).fetchone()
        if rows is None:
            return False
        biggest, held = rows
        own = self._db.execute(f"SELECT COUNT(*) FROM ({union}) WHERE source=?",
                               (*(args * len(tables)), source)).fetchone()[0]
        if biggest == source or held <= own + 1:
            return False
        victims = []
        for t in tables:
            col = dict(_TABLES)[t]
            extra = f"{where} AND" if where else "WHERE"
            row = self._db.execute(f"SELECT rowid, {col} FROM {t} {extra} source=? "
                                   f"ORDER BY {col} LIMIT 1", (*args, biggest)).fetchone()
            if row is not None:
                victims.append((row[1], t, row[0]))
        _, t, rowid = min(victims)
        self._db.execute(f"DELETE FROM {t} WHERE rowid=?", (rowid,))
        log.info("store full: evicted one row of %s (%d held) for %s", biggest, held,
                 source or "this node")
        return True

    def _room_in_list(self, table: str, live: str, args: tuple, source: str, what: str) -> None:
        """Room for one more entry from ``source`` in one topic's (or info-hash's) list,
        then in the store; :class:`ItemError` 202 otherwise."""
        if source != SELF:
            (mine,) = self._db.execute(f"SELECT COUNT(*) FROM {table} {live} AND source=?",
                                       (*args, source)).fetchone()
            if mine >= self.max_per_source_topic:
                raise ItemError(errors.SERVER, f"this node holds as many entries of this {what}"
                                               " for your address as it will")
        (count,) = self._db.execute(f"SELECT COUNT(*) FROM {table} {live}", args).fetchone()
        if count >= self.max_per_topic and not self._evict_one(table, live, args, source):
            raise ItemError(errors.SERVER, f"{what} is full on this node")
        self._make_room(source, now=args[1])

    def _make_room(self, source: str, now: float) -> None:
        """Room for one more row from ``source``, or :class:`ItemError` 202."""
        if source != SELF and self._count(source) >= self.max_per_source:
            raise ItemError(errors.SERVER, "this node holds as many rows for your address as "
                                           "it will; try other nodes")
        if self._count() < self.max_items:
            return
        self.expire(now)
        if self._count() >= self.max_items and not self._evict_one("*", "", (), source):
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

    def put_mutable(self, item: MutableItem, cas: int | None, now: float,
                    source: str = SELF) -> None:
        """Store or refresh ``item`` (already signature-checked); raises :class:`ItemError`."""
        self.validators.check(item)
        stored = self.get_mutable(item.target, now)
        store = decide_mutable_store(stored, item, cas)
        if stored is None:
            (per_key,) = self._db.execute("SELECT COUNT(*) FROM mutable WHERE pubkey=?",
                                          (item.pubkey,)).fetchone()
            if per_key >= self.max_per_key:
                raise ItemError(errors.SERVER, f"this node holds {per_key} items of this key; "
                                               f"at most {self.max_per_key}")
            self._make_room(source, now)
        expires = now + self.item_ttl
        if store:
            self._db.execute(
                "INSERT OR REPLACE INTO mutable VALUES (?,?,?,?,?,?,?,?)",
                (item.target, item.pubkey, item.salt, item.seq, item.encoded_value,
                 item.signature, expires, source if stored is None else self._source_of(
                     "mutable", "target=?", (item.target,))))
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

    def put_immutable(self, encoded: bytes, now: float, source: str = SELF) -> bytes:
        if len(encoded) > MAX_VALUE:
            raise ItemError(errors.VALUE_TOO_BIG, f"value is {len(encoded)} bytes; at most 1000")
        target = hashlib.sha1(encoded).digest()
        if self.get_immutable(target, now) is None:
            self._make_room(source, now)
        else:
            source = self._source_of("immutable", "target=?", (target,))
        self._db.execute("INSERT OR REPLACE INTO immutable VALUES (?,?,?,?)",
                         (target, encoded, now + self.item_ttl, source))
        return target

    def _source_of(self, table: str, where: str, args: tuple) -> str:
        """Who stored a row first: a refresh (or a newer seq) keeps counting against them."""
        row = self._db.execute(f"SELECT source FROM {table} WHERE {where}", args).fetchone()
        return row[0] if row is not None else SELF

    # -- announcements ------------------------------------------------------------------

    def announce(self, topic: bytes, ann: Announcement, now: float,
                 source: str = SELF) -> None:
        """Keep ``ann`` (already checked) as its peer's entry under ``topic``."""
        if ann.expires_at <= now:
            raise ItemError(errors.PROTOCOL, "announcement already expired")
        row = self._db.execute(
            "SELECT expires_at FROM announcements WHERE topic=? AND peer=? AND drop_at>?",
            (topic, ann.peer_id.raw, now)).fetchone()
        if row is not None and ann.expires_at < row[0]:
            raise ItemError(errors.SEQ_TOO_LOW, "an entry expiring later is already stored")
        if row is None:
            self._room_in_list("announcements", "WHERE topic=? AND drop_at>?", (topic, now),
                               source, "topic")
        else:
            source = self._source_of("announcements", "topic=? AND peer=?",
                                     (topic, ann.peer_id.raw))
        self._db.execute(
            "INSERT OR REPLACE INTO announcements VALUES (?,?,?,?,?,?,?)",
            (topic, ann.peer_id.raw, ann.record, ann.expires_at, ann.signature,
             min(ann.expires_at, now + MAX_TTL), source))

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

    # -- BEP 5 peers (announce_peer / get_peers under an info-hash) --------------------------

    def add_peer(self, info_hash: bytes, ip: str, port: int, now: float,
                 source: str = SELF) -> None:
        """Keep ``ip:port`` as a peer of ``info_hash`` for PEER_TTL (BEP 5 announce_peer)."""
        live = "WHERE info_hash=? AND expires_at>?"
        held = self._db.execute(f"SELECT 1 FROM peers {live} AND ip=? AND port=?",
                                (info_hash, now, ip, port)).fetchone()
        if held is None:
            self._room_in_list("peers", live, (info_hash, now), source, "info-hash")
        else:
            source = self._source_of("peers", "info_hash=? AND ip=? AND port=?",
                                     (info_hash, ip, port))
        self._db.execute("INSERT OR REPLACE INTO peers VALUES (?,?,?,?,?)",
                         (info_hash, ip, port, now + PEER_TTL, source))

    def peers(self, info_hash: bytes, now: float, limit: int = MAX_VALUES
              ) -> list[tuple[str, int]]:
        """Up to ``limit`` live peers of ``info_hash``, freshest first."""
        rows = self._db.execute("SELECT ip, port FROM peers WHERE info_hash=? AND expires_at>? "
                                "ORDER BY expires_at DESC LIMIT ?",
                                (info_hash, now, limit)).fetchall()
        return [(str(ip), int(port)) for ip, port in rows]

    # -- expiry and publishing ------------------------------------------------------------

    def expire(self, now: float) -> int:
        """Forget everything past its expiry; returns how many rows went."""
        n = 0
        for table, column in _TABLES:
            n += self._db.execute(f"DELETE FROM {table} WHERE {column}<=?", (now,)).rowcount
        return n

    def counts(self) -> dict[str, int]:
        return {t: self._db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                for t in ("mutable", "immutable", "announcements", "peers", "published")}

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
