"""identity's exception tree; documented in :mod:`identity`'s docstring."""


class IdentityError(Exception):
    """Base of every error identity raises on purpose."""


class KeyFileError(IdentityError):
    """A key file is missing, malformed, or readable by others than its owner."""


class SignatureError(IdentityError):
    """A signature or assertion does not verify."""
