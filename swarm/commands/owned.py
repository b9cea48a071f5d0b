"""Swarms this machine published: the swarm key, the owner credential and charter chain.

Kept under ``<data dir>/owned/<name>/`` (0700, keys 0600) so that restarting
``swarm publish --name NAME`` serves the same swarm (same URI) instead of a new one, and
so that ``swarm owner ...`` can re-sign the charter item (only the swarm key can).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from identity import (
    Authenticator,
    Charter,
    OwnerCredential,
    PeerKey,
    Policy,
    Signed,
    assert_statement,
    enrol,
    open_authenticator,
)
from identity.encoding import decode, encode
from identity.files import write_private
from identity.statements import MAX_NAME  # one limit on a swarm's name: the charter's
from swarm.errors import ConfigError

_SLUG = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass
class OwnedSwarm:
    """A swarm published from this data dir."""

    path: Path
    """Its folder."""
    swarm_key: PeerKey
    """Signs the charter item."""
    credential: OwnerCredential
    """The owner's FIDO2 credential (public part)."""
    head: Signed
    """The current charter with the owner's proof."""
    history: list[bytes]
    """Earlier statements (encoded Signed), oldest first."""

    @property
    def charter(self) -> Charter:
        return self.head.statement  # type: ignore[return-value]

    def save(self) -> None:
        write_private(self.path / "chain.cbor", encode(
            {1: self.head.encode(), 2: self.history, 3: self.credential.to_cbor()}))


def folder(data_dir: Path, name: str) -> Path:
    return Path(data_dir) / "owned" / (_SLUG.sub("_", name) or "_")


def load(data_dir: Path, name: str) -> OwnedSwarm | None:
    path = folder(data_dir, name)
    if not (path / "chain.cbor").exists():
        return None
    m = decode((path / "chain.cbor").read_bytes(), what="owned swarm", limit=1 << 20)
    return OwnedSwarm(path, PeerKey.load(path / "swarm.key"), OwnerCredential.from_cbor(m[3]),
                      Signed.decode(m[1]), list(m[2]))


def find_by_key(data_dir: Path, swarm_pubkey: bytes) -> OwnedSwarm | None:
    """The owned swarm with this public key, if this data dir published it."""
    root = Path(data_dir) / "owned"
    for sub in sorted(root.iterdir()) if root.is_dir() else []:
        if (sub / "chain.cbor").exists():
            owned = load(data_dir, sub.name)
            if owned is not None and owned.swarm_key.public_bytes == swarm_pubkey:
                return owned
    return None


def check_name(name: str) -> None:
    """A swarm's name as the charter will take it (before any key is touched)."""
    if not name or len(name.encode()) > MAX_NAME or not name.isprintable():
        raise ConfigError(f"--name must be 1-{MAX_NAME} bytes of printable text "
                          f"({len(name.encode())} given)")


def create(data_dir: Path, name: str, authenticator: Authenticator,
           policy: Policy) -> OwnedSwarm:
    """A new swarm: a fresh swarm key, an owner credential enrolled now, a signed charter."""
    check_name(name)
    path = folder(data_dir, name)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    swarm_key = PeerKey.load_or_create(path / "swarm.key")
    cred = enrol(authenticator)
    stmt = Charter(swarm=swarm_key.public_bytes, counter=1, name=name, owners=(cred,),
                   policy=policy, admins=())
    head = Signed(stmt, (assert_statement(authenticator, cred, stmt),))
    owned = OwnedSwarm(path, swarm_key, cred, head, [])
    owned.save()
    return owned


def open_owner_key(spec: str) -> Authenticator:
    """``--owner-key`` as an authenticator, its errors as swarm errors (for exit codes)."""
    from identity import NoAuthenticator, OwnerKeySpecError
    from swarm.errors import LocalError

    try:
        return open_authenticator(spec)
    except OwnerKeySpecError as exc:
        raise ConfigError(str(exc)) from None
    except NoAuthenticator as exc:
        raise LocalError(str(exc)) from None
