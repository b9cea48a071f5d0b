"""identity: peer keys, the FIDO2 owner ceremony, signed statements and roles.

Usable without the rest of swarm (imports only ``cryptography`` and ``fido2``).

Exceptions (all in :mod:`identity.errors`)::

    IdentityError              base of everything this package raises on purpose
    +-- KeyFileError           a key file is missing, malformed or not 0600
    +-- SignatureError         a signature or assertion does not verify
"""

from identity.errors import IdentityError, KeyFileError, SignatureError
from identity.keys import PeerId, PeerKey, verify

__all__ = ["IdentityError", "KeyFileError", "PeerId", "PeerKey", "SignatureError", "verify"]
