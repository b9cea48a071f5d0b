"""Verifying a chain of ownership statements, and commands against the result.

A chain starts with the genesis :class:`Charter` (signed by every owner key it lists) and
continues with statements each signed by a key that is an owner key *at that point*.
:func:`apply` checks one more statement against an :class:`Ownership` (a sans-IO step that
a node can run on each new statement it hears of, keeping the result pinned);
:func:`verify_chain` folds it over a whole chain. :func:`verify_command` checks a
kick/block/unblock against the current ownership and the roles table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from identity.ceremony import ORIGIN, RP_ID, OwnerCredential, OwnerProof, verify_proof
from identity.errors import (
    ChainError,
    ExpiredDelegation,
    MalformedStatement,
    NotAuthorized,
    PolicyViolation,
    ReplayError,
    SignatureError,
    WrongSwarm,
)
from identity.keys import PeerId
from identity.roles import Action, Role, may
from identity.statements import (
    ADMIN_ACTIONS,
    AdminDelegation,
    Charter,
    Command,
    OwnershipTransfer,
    PeerSignature,
    Policy,
    Revocation,
    Signed,
)


@dataclass(frozen=True)
class Grant:
    """One admin's rights."""

    scope: frozenset[Action]
    """Actions it may take (a subset of the admin role's)."""
    expires: int | None
    """Unix time the rights end; None for admins listed in the charter."""

    def active(self, now: float) -> bool:
        return self.expires is None or now < self.expires


@dataclass(frozen=True)
class Ownership:
    """Who owns and manages a swarm, as established by a verified chain."""

    swarm: bytes
    """The swarm id (its Ed25519 public key)."""
    name: str
    """The charter's name."""
    owners: tuple[OwnerCredential, ...]
    """Current owner keys; any one of them speaks for the owner."""
    policy: Policy
    """Current policy."""
    admins: Mapping[PeerId, Grant]
    """Admins from the charter (no expiry) and from delegations."""
    counter: int
    """Counter of the last statement applied: anything new must be higher."""
    sign_counts: Mapping[bytes, int] = field(default_factory=dict)
    """Highest FIDO2 sign counter seen per owner credential id."""

    @property
    def owner(self) -> OwnerCredential:
        """The primary owner key."""
        return self.owners[0]

    def owner_key(self, credential_id: bytes) -> OwnerCredential | None:
        return next((c for c in self.owners if c.credential_id == credential_id), None)

    def admin_scope(self, peer: PeerId, now: float) -> frozenset[Action]:
        """What ``peer`` may do as an admin at ``now`` (empty when not an admin)."""
        grant = self.admins.get(peer)
        return grant.scope if grant is not None and grant.active(now) else frozenset()


def verify_chain(statements_with_proofs: Iterable[Signed | bytes], *,
                 swarm_pubkey: bytes | PeerId, now: float, owner_pin: bytes | None = None,
                 rp_id: str = RP_ID, origin: str = ORIGIN) -> Ownership:
    """Verify a whole chain, genesis charter first, and return the ownership it ends in.

    ``owner_pin`` (an :meth:`OwnerCredential.fingerprint`, e.g. from the swarm URI) pins the
    founding owner: whoever steals the swarm key still cannot found a chain of their own.
    Raises a :class:`ChainError` subclass, :class:`SignatureError` subclass or
    :class:`MalformedStatement` naming the first statement that is wrong and why.
    """
    swarm = swarm_pubkey.raw if isinstance(swarm_pubkey, PeerId) else bytes(swarm_pubkey)
    ownership: Ownership | None = None
    for index, item in enumerate(statements_with_proofs):
        try:
            signed = Signed.decode(bytes(item)) if isinstance(item, bytes | bytearray) else item
            if ownership is None:
                ownership = genesis(signed, swarm=swarm, rp_id=rp_id, origin=origin)
                if owner_pin is not None and not any(
                        c.fingerprint() == owner_pin for c in ownership.owners):
                    raise NotAuthorized("the founding charter's owner is not the pinned owner "
                                        "key (a charter made with a stolen swarm key?)")
            else:
                ownership = apply(ownership, signed, now=now, rp_id=rp_id, origin=origin)
        except (ChainError, SignatureError, MalformedStatement) as exc:
            raise type(exc)(f"statement {index}: {exc}") from exc
    if ownership is None:
        raise WrongSwarm("empty chain: it must start with the swarm's charter")
    return ownership


def genesis(signed: Signed, *, swarm: bytes, rp_id: str = RP_ID,
            origin: str = ORIGIN) -> Ownership:
    """The ownership a founding charter establishes; one of the owner keys it lists signs it.

    Listing a second key the signer vouches for is how a recovery key is enrolled.
    """
    charter = signed.statement
    if not isinstance(charter, Charter):
        raise WrongSwarm(f"a chain starts with a Charter, not {type(charter).__name__}")
    if charter.swarm != swarm:
        raise WrongSwarm("charter is for another swarm (its swarm key differs)")
    _check_hardware(charter.policy, charter.owners)
    proofs = _owner_proofs(signed)
    if len(proofs) != 1:
        raise NotAuthorized("a founding charter carries exactly one owner proof")
    cred = next((c for c in charter.owners if c.credential_id == proofs[0].credential_id), None)
    if cred is None:
        raise NotAuthorized("the founding charter is not signed by an owner key it lists")
    counts = {cred.credential_id: verify_proof(cred, charter, proofs[0], last_counter=0,
                                               rp_id=rp_id, origin=origin)}
    admins = {peer: Grant(frozenset(ADMIN_ACTIONS), None) for peer in charter.admins}
    return Ownership(swarm, charter.name, charter.owners, charter.policy, admins,
                     charter.counter, counts)


def apply(ownership: Ownership, signed: Signed, *, now: float, rp_id: str = RP_ID,
          origin: str = ORIGIN) -> Ownership:
    """Check one more ownership statement against ``ownership``; return the new ownership."""
    stmt = signed.statement
    if stmt.swarm != ownership.swarm:
        raise WrongSwarm("statement is for another swarm")
    if stmt.counter <= ownership.counter:
        raise ReplayError(f"counter {stmt.counter} is not above {ownership.counter}: a "
                          "replayed or out-of-order statement")
    if not isinstance(stmt, Charter | AdminDelegation | OwnershipTransfer | Revocation):
        raise ChainError(f"{type(stmt).__name__} is not an ownership statement "
                         "(check commands with verify_command)")
    proofs = _owner_proofs(signed)
    counts = dict(ownership.sign_counts)

    def check_owner_proof(proof: OwnerProof, what: str) -> OwnerCredential:
        cred = ownership.owner_key(proof.credential_id)
        if cred is None:
            raise NotAuthorized(f"{what} is not signed by a current owner key")
        counts[cred.credential_id] = verify_proof(
            cred, stmt, proof, last_counter=counts.get(cred.credential_id, 0),
            rp_id=rp_id, origin=origin)
        return cred

    if isinstance(stmt, OwnershipTransfer):
        if len(proofs) != 2:
            raise NotAuthorized("a transfer needs two owner proofs: the current owner's, "
                                "then the new owner's acceptance")
        check_owner_proof(proofs[0], "the transfer")
        new = stmt.new_owner
        if ownership.owner_key(new.credential_id) is not None:
            raise ChainError("transfer to a key that already owns the swarm")
        if proofs[1].credential_id != new.credential_id:
            raise NotAuthorized("the transfer is not accepted by the new owner key it names")
        _check_hardware(ownership.policy, (new,))
        counts = {new.credential_id: verify_proof(new, stmt, proofs[1], last_counter=0,
                                                  rp_id=rp_id, origin=origin)}
        return replace(ownership, owners=(new,), counter=stmt.counter, sign_counts=counts)

    if len(proofs) != 1:
        raise NotAuthorized(f"{type(stmt).__name__} needs exactly one owner proof")
    check_owner_proof(proofs[0], type(stmt).__name__)

    if isinstance(stmt, Charter):
        if not all(any(a.same_key(b) for b in stmt.owners) for a in ownership.owners):
            raise NotAuthorized("a charter update may add owner keys but not drop or change "
                                "them (use a revocation or a transfer)")
        _check_hardware(stmt.policy, stmt.owners)
        admins = {p: g for p, g in ownership.admins.items() if g.expires is not None}
        admins.update({p: Grant(frozenset(ADMIN_ACTIONS), None) for p in stmt.admins})
        return replace(ownership, name=stmt.name, policy=stmt.policy, admins=admins,
                       counter=stmt.counter, sign_counts=counts)
    if isinstance(stmt, AdminDelegation):
        if stmt.expires <= now:
            raise ExpiredDelegation(f"delegation to {stmt.admin.short()} expired at "
                                    f"{stmt.expires} (now {int(now)})")
        admins = dict(ownership.admins)
        admins[stmt.admin] = Grant(frozenset(stmt.scope), stmt.expires)
        return replace(ownership, admins=admins, counter=stmt.counter, sign_counts=counts)
    if isinstance(stmt, Revocation):
        if stmt.kind == "admin":
            peer = PeerId(stmt.target) if len(stmt.target) == 32 else None
            if peer is None or peer not in ownership.admins:
                raise ChainError("revocation names a peer that is not an admin")
            admins = {p: g for p, g in ownership.admins.items() if p != peer}
            return replace(ownership, admins=admins, counter=stmt.counter,
                           sign_counts=counts)
        if ownership.owner_key(stmt.target) is None:
            raise ChainError("revocation names a key that is not an owner key")
        owners = tuple(c for c in ownership.owners if c.credential_id != stmt.target)
        if not owners:
            raise ChainError("cannot revoke the last owner key (transfer ownership instead)")
        counts.pop(stmt.target, None)
        return replace(ownership, owners=owners, counter=stmt.counter, sign_counts=counts)
    raise AssertionError("unreachable: statement types are checked above")


def verify_command(signed: Signed, ownership: Ownership, *, now: float,
                   coordinator: PeerId | None = None, min_term: int = 0,
                   rp_id: str = RP_ID, origin: str = ORIGIN) -> Role:
    """Check a kick/block/unblock: its signer holds the role it claims, and the role may.

    ``coordinator`` is the coordinator of the command's term as this node knows it;
    ``min_term`` the highest term seen (fencing: older terms are refused). Replay of a
    command is the caller's to track by (issuer, counter). Returns the role acted under.
    """
    cmd = signed.statement
    if not isinstance(cmd, Command):
        raise ChainError(f"{type(cmd).__name__} is not a command")
    if cmd.swarm != ownership.swarm:
        raise WrongSwarm("command is for another swarm")
    if cmd.term < min_term:
        raise ReplayError(f"command from term {cmd.term}, but term {min_term} has been seen")
    action = cmd.ACTION
    assert action is not None  # noqa: S101 - every Command subclass names its action
    if not may(cmd.role, action):
        raise NotAuthorized(f"the {cmd.role} role may not {action}")
    if len(signed.proofs) != 1:
        raise NotAuthorized("a command carries exactly one proof")
    proof = signed.proofs[0]
    if cmd.role is Role.OWNER:
        if not isinstance(proof, OwnerProof):
            raise NotAuthorized("an owner command needs the owner's FIDO2 proof")
        cred = ownership.owner_key(proof.credential_id)
        if cred is None:
            raise NotAuthorized("owner command not signed by a current owner key")
        verify_proof(cred, cmd, proof, last_counter=ownership.sign_counts.get(
            cred.credential_id, 0), rp_id=rp_id, origin=origin)
        return Role.OWNER
    if not isinstance(proof, PeerSignature):
        raise NotAuthorized(f"an {cmd.role} command is signed with a peer key")
    if not proof.verifies(cmd):
        raise SignatureError(f"peer signature by {proof.signer.short()} does not verify")
    if cmd.role is Role.ADMIN:
        grant = ownership.admins.get(proof.signer)
        if grant is None:
            raise NotAuthorized(f"{proof.signer.short()} is not an admin of this swarm")
        if not grant.active(now):
            raise ExpiredDelegation(f"{proof.signer.short()}'s admin delegation expired at "
                                    f"{grant.expires}")
        if action not in grant.scope:
            raise NotAuthorized(f"{proof.signer.short()}'s delegation does not cover {action}")
        return Role.ADMIN
    if coordinator is None or proof.signer != coordinator:
        raise NotAuthorized(f"{proof.signer.short()} is not the coordinator of term "
                            f"{cmd.term}")
    return Role.COORDINATOR


def _owner_proofs(signed: Signed) -> list[OwnerProof]:
    if not all(isinstance(p, OwnerProof) for p in signed.proofs):
        raise NotAuthorized("ownership statements are signed only with owner FIDO2 keys")
    return list(signed.proofs)  # type: ignore[arg-type]


def _check_hardware(policy: Policy, owners: Iterable[OwnerCredential]) -> None:
    if policy.require_hardware:
        soft = [c.short() for c in owners if not c.hardware_backed]
        if soft:
            raise PolicyViolation(f"policy requires hardware-backed owner keys; {soft} "
                                  "is not (software key, or no vendor attestation)")
