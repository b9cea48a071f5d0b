"""Join URIs: BEP 46 style magnet links naming a swarm by its public key.

``magnet:?xs=urn:btpk:<swarm pubkey hex>&s=<salt hex>&dn=<name>&x.op=<owner pin hex>
&x.pe=host:port...``

The key and salt locate the swarm's charter (a BEP 44 mutable item); ``dn`` is only a
display name (the charter is the authority); ``x.op`` pins the founding owner's FIDO2 key
(16-byte fingerprint), so a stolen swarm key cannot found a new chain; ``x.pe`` entries
are bootstrap hints, several allowed (``swarm status --json`` prints a fresh ``join_uri``
naming live peers). A URI is
untrusted input (it arrives by chat or e-mail), so it is size-limited and every part is
checked; a parse error says which part is wrong.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from urllib.parse import quote, unquote

from dht.items import MAX_SALT  # BEP 44 limit on a salt
from swarm.errors import URIError

MAX_URI = 4096
MAX_NAME = 100
MAX_PEERS = 16
OWNER_PIN = 16
DEFAULT_SALT = b"swarm"
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
_PREFIX = "magnet:?"
_XS = "urn:btpk:"


@dataclass(frozen=True)
class JoinURI:
    """A parsed join URI."""

    pubkey: bytes
    """The swarm's Ed25519 public key (32 bytes); signs the charter."""
    name: str = ""
    """Display name; the charter's name is the authority."""
    salt: bytes = DEFAULT_SALT
    """BEP 44 salt of the charter item."""
    peers: tuple[tuple[str, int], ...] = field(default_factory=tuple)
    """Bootstrap hints: (host, port) of DHT nodes in the swarm."""
    owner: bytes = b""
    """Fingerprint of the founding owner key (16 bytes), or empty when not pinned."""

    def __post_init__(self) -> None:
        if len(self.pubkey) != 32:
            raise URIError("xs: the swarm public key must be 32 bytes")
        if len(self.salt) > MAX_SALT:
            raise URIError(f"s: salt longer than {MAX_SALT} bytes")
        _check_name(self.name)
        if len(self.owner) not in (0, OWNER_PIN):
            raise URIError(f"x.op: the owner pin is {OWNER_PIN} bytes ({2 * OWNER_PIN} hex)")
        if len(self.peers) > MAX_PEERS:
            raise URIError(f"x.pe: more than {MAX_PEERS} bootstrap peers")
        for host, port in self.peers:
            _check_host(host)
            if not 0 < port < 65536:
                raise URIError(f"x.pe: port {port} out of range 1-65535")

    @property
    def swarm_id(self) -> bytes:
        """The BEP 44 target of the charter: SHA-1(pubkey + salt), 20 bytes."""
        return hashlib.sha1(self.pubkey + self.salt).digest()  # noqa: S324 - BEP 44 target

    def with_peers(self, extra: Iterable[tuple[str, int]]) -> JoinURI:
        """This URI with ``extra`` bootstrap peers first (deduplicated, at most MAX_PEERS):
        ``--bootstrap`` addresses are known to answer more often than old ``x.pe`` hints."""
        peers = tuple(dict.fromkeys([*extra, *self.peers]))[:MAX_PEERS]
        return replace(self, peers=peers)

    def __str__(self) -> str:
        parts = [f"xs={_XS}{self.pubkey.hex()}", f"s={self.salt.hex()}"]
        if self.name:
            parts.append("dn=" + quote(self.name, safe=""))
        if self.owner:
            parts.append(f"x.op={self.owner.hex()}")
        for host, port in self.peers:
            shown = f"[{host}]" if ":" in host else host
            parts.append(f"x.pe={quote(shown, safe='[]:')}:{port}")
        return _PREFIX + "&".join(parts)


def _check_name(name: str) -> None:
    if len(name) > MAX_NAME:
        raise URIError(f"dn: name longer than {MAX_NAME} characters")
    if any(not ch.isprintable() for ch in name):
        raise URIError("dn: name contains control characters")


def _check_host(host: str) -> None:
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    if not _HOSTNAME.match(host):
        raise URIError(f"x.pe: {host[:60]!r} is not an IP address or host name")


def parse_peer(text: str) -> tuple[str, int]:
    """Parse ``host:port`` or ``[v6]:port`` (also used for ``--bootstrap``)."""
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise URIError(f"x.pe: {text[:60]!r} is not [IPv6]:port")
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or ":" in host:
            raise URIError(f"x.pe: {text[:60]!r} is not host:port")
    if not (port_text.isascii() and port_text.isdigit()) or len(port_text) > 5:
        raise URIError(f"x.pe: port {port_text[:10]!r} is not a number")
    port = int(port_text)
    if not 0 < port < 65536:
        raise URIError(f"x.pe: port {port} out of range 1-65535")
    _check_host(host)
    return host, port


def _hex(part: str, value: str) -> bytes:
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise URIError(f"{part}: {value[:70]!r} is not hex") from None


def not_a_uri(text: str, also: str = "") -> URIError:
    """The one message every command gives for text that is no join URI (``also``: what
    else the command takes, e.g. HOST:PORT)."""
    return URIError(f"{text[:60]!r} is not a join URI: expected {_PREFIX}xs=urn:btpk:... as "
                    f"`swarm publish` or `swarm status --json` (join_uri) printed it{also}")


def parse_target(text: str) -> tuple[JoinURI | None, list[tuple[str, int]]]:
    """A join URI, or ``HOST:PORT[,HOST:PORT...]`` bootstrap addresses (``swarm submit``
    and :func:`swarm.connect` take both): (uri, []) or (None, peers). The URI's owner pin
    is not required: a client verifies no charter."""
    if not isinstance(text, str) or not text.strip():
        raise not_a_uri(str(text), " or HOST:PORT")
    if text.strip().startswith(_PREFIX):
        return parse(text, require_owner=False), []
    try:
        return None, [parse_peer(part.strip()) for part in text.split(",")]
    except URIError:
        raise not_a_uri(text, " or HOST:PORT") from None


def parse(text: str, require_owner: bool = True) -> JoinURI:
    """Parse a join URI; :class:`URIError` names the part that is wrong.

    A URI without the owner pin ``x.op`` is refused unless ``require_owner`` is False (a
    caller that never verifies a charter, e.g. an embedded local swarm): without the pin a
    stolen swarm key could found a new ownership chain unnoticed."""
    if not isinstance(text, str):
        raise URIError("a join URI is text")
    text = text.strip()
    if len(text) > MAX_URI:
        raise URIError(f"join URI longer than {MAX_URI} characters")
    if not text.startswith(_PREFIX):
        raise not_a_uri(text)
    fields: dict[str, str] = {}
    peers: list[tuple[str, int]] = []
    for item in text[len(_PREFIX):].split("&"):
        if not item:
            continue
        key, sep, raw = item.partition("=")
        if not sep:
            raise URIError(f"parameter {key[:30]!r} has no '=value'")
        try:
            value = unquote(raw, errors="strict")
        except UnicodeDecodeError:
            raise URIError(f"{key[:30]}: percent-escapes are not UTF-8") from None
        if key == "x.pe":
            if len(peers) >= MAX_PEERS:
                raise URIError(f"x.pe: more than {MAX_PEERS} bootstrap peers")
            peers.append(parse_peer(value))
        elif key in ("xs", "s", "dn", "x.op"):
            if key in fields:
                raise URIError(f"{key}: given twice")
            fields[key] = value
        # Other magnet parameters are ignored, as magnet readers do.
    if "xs" not in fields:
        raise URIError("xs: missing (expected xs=urn:btpk:<64 hex digits>)")
    xs = fields["xs"]
    if not xs.startswith(_XS):
        raise URIError(f"xs: {xs[:40]!r} is not urn:btpk:<64 hex digits>")
    key_hex = xs[len(_XS):]
    if len(key_hex) != 64:
        raise URIError(f"xs: public key has {len(key_hex)} hex digits, expected 64")
    pubkey = _hex("xs", key_hex)
    salt = _hex("s", fields["s"]) if "s" in fields else DEFAULT_SALT
    owner = _hex("x.op", fields["x.op"]) if "x.op" in fields else b""
    join = JoinURI(pubkey=pubkey, name=fields.get("dn", ""), salt=salt, peers=tuple(peers),
                   owner=owner)
    if require_owner and not owner:
        raise URIError("x.op: missing; the URI does not pin the swarm's owner key (ask the "
                       "owner for the URI that `swarm publish` printed)")
    return join
