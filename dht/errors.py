"""dht's exception tree; documented in :mod:`dht`'s docstring."""


class DHTError(Exception):
    """Base of every error dht raises on purpose."""


class ItemError(DHTError):
    """An invalid BEP 44 item; ``code`` is the BEP 44 error number."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{message} (BEP 44 error {code})")
        self.code = code


class LookupFailed(DHTError):
    """No responder had a valid value, or no node could be reached."""
