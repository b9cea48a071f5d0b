"""identity: peer keys, the FIDO2 owner ceremony, signed statements and roles.

Usable without the rest of swarm (imports only ``cryptography`` and ``fido2``).

- Peer keys (:mod:`identity.keys`): Ed25519, ``PeerId`` = the public key, files 0600.
- Owner keys: :func:`open_authenticator` (``fido2`` or ``soft:PATH``), :func:`enrol`,
  :func:`assert_statement`, :func:`verify_proof` (:mod:`identity.ceremony`), all through
  fido2's own ``Fido2Client`` / ``Fido2Server``; :class:`SoftAuthenticator` is a software
  CTAP2 device for tests and demos, never counted as hardware-backed.
- Statements (:mod:`identity.statements`): canonical CBOR, with swarm id and counter;
  :class:`Signed` = statement + proofs. :func:`verify_chain` returns the :class:`Ownership`
  a chain establishes; :func:`verify_command` checks a kick/block/unblock.
- Roles (:mod:`identity.roles`): :func:`may` answers from one table.

Exceptions (all in :mod:`identity.errors`)::

    IdentityError                  base of everything this package raises on purpose
    +-- KeyFileError               a key file is missing, malformed or not 0600
    +-- SignatureError             a signature or assertion does not verify
    |   +-- TamperedStatement      the proof was made over other bytes (statement altered)
    |   +-- WrongRelyingParty      another RP id, origin or ceremony type
    |   +-- UserNotPresent         no user-present flag: the key was not touched
    +-- MalformedStatement         (also ValueError) truncated, non-canonical, oversized, unknown
    +-- NoAuthenticator            no FIDO2 security key plugged in
    +-- AuthenticatorError         the key refused or failed (denied, PIN, unknown credential)
    +-- OwnerKeySpecError          (also ValueError) --owner-key is not fido2 or soft:PATH
    +-- ChainError                 a chain of statements is inconsistent
        +-- WrongSwarm             another swarm's statement, or no charter first
        +-- ReplayError            statement counter (or command term) did not increase
        |   +-- CounterRegression  an authenticator's sign counter went backwards
        +-- NotAuthorized          signer lacks the role, scope or ownership
        |   +-- ExpiredDelegation  an admin delegation has expired
        +-- PolicyViolation        the policy refuses it (software key, require_hardware)
"""

from identity.authenticators import (
    NO_KEY_MESSAGE,
    Authenticator,
    TerminalInteraction,
    open_authenticator,
)
from identity.ceremony import (
    ORIGIN,
    RP_ID,
    OwnerCredential,
    OwnerProof,
    assert_statement,
    digest,
    enrol,
    verify_proof,
)
from identity.chain import Grant, Ownership, apply, genesis, verify_chain, verify_command
from identity.errors import (
    AuthenticatorError,
    ChainError,
    CounterRegression,
    ExpiredDelegation,
    IdentityError,
    KeyFileError,
    MalformedStatement,
    NoAuthenticator,
    NotAuthorized,
    OwnerKeySpecError,
    PolicyViolation,
    ReplayError,
    SignatureError,
    TamperedStatement,
    UserNotPresent,
    WrongRelyingParty,
    WrongSwarm,
)
from identity.keys import PeerId, PeerKey, verify
from identity.roles import Action, Role, may
from identity.softkey import SOFT_AAGUID, SoftAuthenticator
from identity.statements import (
    AdminDelegation,
    BlockCommand,
    Charter,
    Command,
    KickCommand,
    OwnershipTransfer,
    PeerSignature,
    Policy,
    Revocation,
    Signed,
    Statement,
    UnblockCommand,
    decode_statement,
    sign_as_peer,
)

__all__ = [
    "NO_KEY_MESSAGE", "ORIGIN", "RP_ID", "SOFT_AAGUID", "Action", "AdminDelegation",
    "Authenticator", "AuthenticatorError", "BlockCommand", "ChainError", "Charter", "Command",
    "CounterRegression", "ExpiredDelegation", "Grant", "IdentityError", "KeyFileError",
    "KickCommand", "MalformedStatement", "NoAuthenticator", "NotAuthorized", "OwnerCredential",
    "OwnerKeySpecError", "OwnerProof", "Ownership", "OwnershipTransfer", "PeerId", "PeerKey",
    "PeerSignature", "Policy", "PolicyViolation", "ReplayError", "Revocation", "Role",
    "SignatureError", "Signed", "SoftAuthenticator", "Statement", "TamperedStatement",
    "TerminalInteraction", "UnblockCommand", "UserNotPresent", "WrongRelyingParty",
    "WrongSwarm", "apply", "assert_statement", "decode_statement", "digest", "enrol",
    "genesis", "may", "open_authenticator", "sign_as_peer", "verify", "verify_chain",
    "verify_command", "verify_proof",
]
