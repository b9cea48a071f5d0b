"""identity's exception tree; documented in :mod:`identity`'s docstring."""


class IdentityError(Exception):
    """Base of every error identity raises on purpose."""


class KeyFileError(IdentityError):
    """A key file is missing, malformed, or readable by others than its owner."""


class SignatureError(IdentityError):
    """A signature or assertion does not verify."""


class TamperedStatement(SignatureError):
    """A proof was made over other bytes than the statement it comes with."""


class WrongRelyingParty(SignatureError):
    """An assertion names another RP id, origin or ceremony type than this swarm's."""


class UserNotPresent(SignatureError):
    """An assertion lacks the user-present flag: nobody touched the key."""


class MalformedStatement(IdentityError, ValueError):
    """Bytes are not a canonical statement or proof (truncated, oversized, unknown fields)."""


class NoAuthenticator(IdentityError):
    """No FIDO2 security key is plugged in (or none can be opened)."""


class AuthenticatorError(IdentityError):
    """The authenticator refused or failed a ceremony (denied, PIN, unknown credential)."""


class OwnerKeySpecError(IdentityError, ValueError):
    """An ``--owner-key`` value is neither ``fido2`` nor ``soft:PATH``."""


class ChainError(IdentityError):
    """A chain of statements is inconsistent; the message says which statement and why."""


class WrongSwarm(ChainError):
    """A statement belongs to another swarm, or a chain does not start with a charter."""


class ReplayError(ChainError):
    """A statement counter did not increase: an old statement was replayed."""


class CounterRegression(ReplayError):
    """An authenticator's sign counter went backwards (a cloned key or a replayed proof)."""


class NotAuthorized(ChainError):
    """The signer may not make this statement (not the current owner, wrong role or scope)."""


class ExpiredDelegation(NotAuthorized):
    """An admin delegation has expired (or the statement outlives it)."""


class PolicyViolation(ChainError):
    """The swarm's policy refuses this (a software key where hardware is required)."""
