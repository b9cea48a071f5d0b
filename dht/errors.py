"""dht's exception tree; documented in :mod:`dht`'s docstring."""

# BEP 44 / BEP 5 error numbers used in replies and in ItemError.code.
GENERIC = 201
SERVER = 202
PROTOCOL = 203
VALUE_TOO_BIG = 205
BAD_SIGNATURE = 206
SALT_TOO_BIG = 207
CAS_MISMATCH = 301
SEQ_TOO_LOW = 302


class DHTError(Exception):
    """Base of every error dht raises on purpose."""


class BencodeError(DHTError, ValueError):
    """Bytes that are not exactly one canonical bencoded value, or an unencodable value."""


class ItemError(DHTError):
    """An invalid or refused item; ``code`` is the BEP 44 / BEP 5 error number."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{message} (error {code})")
        self.code = code
        self.message = message


class LookupFailed(DHTError):
    """No responder had a valid value, or no node could be reached."""


class PeerUnreachable(DHTError):
    """A direct request (e.g. ``send_message``) got no reply in time."""


class MessageTooLarge(DHTError, ValueError):
    """A ``send_message`` payload over 4 KiB; nothing was sent."""


class MessageRefused(DHTError):
    """The peer answered a ``send_message`` with an error; ``code`` says why."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"message refused: {message} (error {code})")
        self.code = code
