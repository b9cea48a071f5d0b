"""A software CTAP2 authenticator: a real ``fido2.ctap.CtapDevice`` backed by a 0600 file.

It lets tests and demos run the very same ``fido2.client.Fido2Client`` path as a YubiKey:
CTAP2 getInfo, makeCredential and getAssertion, in canonical CBOR, with ES256 or EdDSA
credentials, a persisted sign counter, user presence announced through
``on_keepalive(STATUS.UPNEEDED)`` and self attestation ("packed" without x5c).

Like most security keys it keeps no per-credential state: a credential id *is* the
credential's private key, wrapped (AES-GCM) under the file's master secret and bound to the
RP id. The file holds only that secret and the sign counter. Anyone who can read the file
can sign as the owner, which is why it is never counted as hardware-backed.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import stat
import struct
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from fido2 import cbor
from fido2.cose import ES256, EdDSA
from fido2.ctap import STATUS, CtapDevice, CtapError
from fido2.hid import CAPABILITY, CTAPHID
from fido2.webauthn import Aaguid, AttestedCredentialData, AuthenticatorData

from identity.encoding import decode
from identity.errors import KeyFileError, MalformedStatement
from identity.files import write_private

SOFT_AAGUID = Aaguid(bytes.fromhex("73776172 6d2d736f 66742d6b 65792d31".replace(" ", "")))
"""The AAGUID every software authenticator reports (ASCII ``swarm-soft-key-1``)."""

ERR = CtapError.ERR
_CMD_MAKE_CREDENTIAL = 0x01
_CMD_GET_ASSERTION = 0x02
_CMD_GET_INFO = 0x04
_MAX_MSG = 1200
_MAX_CRED_ID = 128
_MAX_CREDS_IN_LIST = 8
_WRAP_VERSION = 1
_ALG_CODES = {ES256.ALGORITHM: 1, EdDSA.ALGORITHM: 2}
_FILE_VERSION = 1

Presence = Callable[[], bool]
"""Asked once per ceremony that needs user presence; False means the user said no."""


def _always_present() -> bool:
    return True


class _Secret:
    """The 0600 file: master secret and sign counter.

    The counter is read, raised and written back under an exclusive lock on every use, so
    two processes (or two opens) sharing one key file never hand out the same counter.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        if not path.exists():
            self._create()
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise KeyFileError(f"software key file {path} has mode {mode:o}; it must be 600 "
                               f"(run: chmod 600 {path})")
        self.master, self.counter = self._parse(path.read_bytes())
        self.wrap_key = HKDF(hashes.SHA256(), 32, salt=None,
                             info=b"swarm soft key: credential wrap").derive(self.master)

    def _parse(self, body: bytes) -> tuple[bytes, int]:
        try:
            data = cbor.decode(body)
            ok = (isinstance(data, dict) and data.get(1) == _FILE_VERSION
                  and isinstance(data.get(2), bytes) and len(data[2]) == 32
                  and isinstance(data.get(3), int) and 0 <= data[3] < 2**32)
        except (ValueError, KeyError, IndexError, TypeError, struct.error) as exc:
            raise KeyFileError(f"software key file {self.path} is corrupt") from exc
        if not ok:
            raise KeyFileError(f"software key file {self.path} is not a swarm software key")
        return data[2], data[3]

    def _create(self) -> None:
        """Write a complete new file, put in place only where none stands: another process
        racing us either sees no file or a whole one (and when it made one first, we load
        that one)."""
        write_private(self.path, cbor.encode({1: _FILE_VERSION, 2: os.urandom(32), 3: 0}),
                      exclusive=True)

    def next_counter(self) -> int:
        """Raise and persist the counter before the signature leaves the device."""
        with open(self.path, "r+b") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            master, stored = self._parse(f.read())
            if master != self.master:
                raise KeyFileError(f"software key file {self.path} was replaced while open")
            self.counter = max(stored, self.counter) + 1
            f.seek(0)
            f.write(cbor.encode({1: _FILE_VERSION, 2: self.master, 3: self.counter}))
            f.truncate()
            f.flush()
            os.fsync(f.fileno())
        return self.counter


class _Reject(Exception):
    """Internal: answer the current command with this CTAP error code."""

    def __init__(self, code: int) -> None:
        self.code = code


def _want(params: Mapping[int, Any], key: int, typ: type | tuple[type, ...],
          required: bool = True) -> Any:
    if key not in params:
        if required:
            raise _Reject(ERR.MISSING_PARAMETER)
        return None
    value = params[key]
    if not isinstance(value, typ) or (isinstance(value, bool) and typ is int):
        raise _Reject(ERR.CBOR_UNEXPECTED_TYPE)
    return value


class SoftAuthenticator(CtapDevice):
    """A CTAP2 authenticator in software. Not hardware-backed, ever."""

    hardware_backed = False

    def __init__(self, path: Path, *, presence: Presence = _always_present) -> None:
        self._secret = _Secret(Path(path))
        self._presence = presence
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SoftAuthenticator({self._secret.path})"

    @property
    def path(self) -> Path:
        return self._secret.path

    @property
    def capabilities(self) -> int:
        return CAPABILITY.CBOR | CAPABILITY.NMSG

    @classmethod
    def list_devices(cls) -> Iterator[CtapDevice]:
        """Software keys are opened by path (``soft:PATH``), never discovered."""
        return iter(())

    # -- CTAPHID transport ---------------------------------------------------------------

    def call(self, cmd: int, data: bytes = b"", event: threading.Event | None = None,
             on_keepalive: Callable[[STATUS], None] | None = None) -> bytes:
        if cmd != CTAPHID.CBOR:
            raise CtapError(ERR.INVALID_COMMAND)
        if not data:
            return bytes([ERR.INVALID_LENGTH])
        if len(data) > _MAX_MSG:
            return bytes([ERR.REQUEST_TOO_LARGE])
        handlers = {_CMD_GET_INFO: self._get_info, _CMD_MAKE_CREDENTIAL: self._make_credential,
                    _CMD_GET_ASSERTION: self._get_assertion}
        handler = handlers.get(data[0])
        if handler is None:
            return bytes([ERR.INVALID_COMMAND])
        params: Mapping[int, Any] = {}
        if len(data) > 1:
            try:
                params = decode(data[1:], what="CTAP2 request", limit=_MAX_MSG)
            except MalformedStatement:
                return bytes([ERR.INVALID_CBOR])
            if not isinstance(params, dict):
                return bytes([ERR.INVALID_CBOR])
        try:
            with self._lock:
                response = handler(params, event, on_keepalive)
        except _Reject as rej:
            return bytes([rej.code])
        return b"\x00" + cbor.encode(response)

    # -- commands ------------------------------------------------------------------------

    def _get_info(self, params, event, on_keepalive) -> dict[int, Any]:
        return {
            1: ["FIDO_2_0"],
            3: bytes(SOFT_AAGUID),
            4: {"rk": False, "up": True, "plat": False},
            5: _MAX_MSG,
            7: _MAX_CREDS_IN_LIST,
            8: _MAX_CRED_ID,
            10: [{"alg": ES256.ALGORITHM, "type": "public-key"},
                 {"alg": EdDSA.ALGORITHM, "type": "public-key"}],
        }

    def _user_present(self, event, on_keepalive) -> None:
        if on_keepalive is not None:
            on_keepalive(STATUS.UPNEEDED)
        if event is not None and event.is_set():
            raise _Reject(ERR.KEEPALIVE_CANCEL)
        if not self._presence():
            raise _Reject(ERR.OPERATION_DENIED)

    def _refuse_pin(self, params: Mapping[int, Any], key: int, event, on_keepalive) -> None:
        """No PIN on a software key: a zero-length pinUvAuthParam probes for one (CTAP 2.0)."""
        pin_auth = _want(params, key, bytes, required=False)
        if pin_auth is None:
            return
        if not pin_auth:
            self._user_present(event, on_keepalive)
            raise _Reject(ERR.PIN_NOT_SET)
        raise _Reject(ERR.PIN_AUTH_INVALID)

    def _make_credential(self, params, event, on_keepalive) -> dict[int, Any]:
        client_data_hash = _want(params, 1, bytes)
        rp = _want(params, 2, dict)
        user = _want(params, 3, dict)
        key_params = _want(params, 4, list)
        exclude = _want(params, 5, list, required=False) or []
        options = _want(params, 7, dict, required=False) or {}
        if len(client_data_hash) != 32 or not isinstance(rp.get("id"), str):
            raise _Reject(ERR.INVALID_PARAMETER)
        if not isinstance(user.get("id"), bytes):
            raise _Reject(ERR.INVALID_PARAMETER)
        self._refuse_pin(params, 8, event, on_keepalive)
        if options.get("rk"):
            raise _Reject(ERR.UNSUPPORTED_OPTION)
        if options.get("uv"):
            raise _Reject(ERR.INVALID_OPTION)
        alg = next((p.get("alg") for p in key_params if isinstance(p, dict)
                    and p.get("type") == "public-key" and p.get("alg") in _ALG_CODES), None)
        if alg is None:
            raise _Reject(ERR.UNSUPPORTED_ALGORITHM)
        rp_id_hash = hashlib.sha256(rp["id"].encode()).digest()
        if any(self._unwrap(d, rp_id_hash) for d in exclude):
            self._user_present(event, on_keepalive)
            raise _Reject(ERR.CREDENTIAL_EXCLUDED)
        self._user_present(event, on_keepalive)

        if alg == ES256.ALGORITHM:
            key: Any = ec.generate_private_key(ec.SECP256R1())
            secret = key.private_numbers().private_value.to_bytes(32, "big")
            cose = ES256.from_cryptography_key(key.public_key())
        else:
            key = Ed25519PrivateKey.generate()
            secret = key.private_bytes_raw()
            cose = EdDSA.from_cryptography_key(key.public_key())
        cred_id = self._wrap(alg, secret, rp_id_hash)
        flags = AuthenticatorData.FLAG.UP | AuthenticatorData.FLAG.AT
        auth_data = AuthenticatorData.create(
            rp_id_hash, flags, self._secret.next_counter(),
            AttestedCredentialData.create(SOFT_AAGUID, cred_id, cose))
        signature = _sign(alg, key, bytes(auth_data) + client_data_hash)
        return {1: "packed", 2: bytes(auth_data), 3: {"alg": alg, "sig": signature}}

    def _get_assertion(self, params, event, on_keepalive) -> dict[int, Any]:
        rp_id = _want(params, 1, str)
        client_data_hash = _want(params, 2, bytes)
        allow = _want(params, 3, list, required=False) or []
        options = _want(params, 5, dict, required=False) or {}
        if len(client_data_hash) != 32:
            raise _Reject(ERR.INVALID_PARAMETER)
        self._refuse_pin(params, 6, event, on_keepalive)
        if options.get("uv"):
            raise _Reject(ERR.INVALID_OPTION)
        if options.get("rk") is not None:
            raise _Reject(ERR.INVALID_OPTION)
        rp_id_hash = hashlib.sha256(rp_id.encode()).digest()
        found = next(((d["id"], k) for d in allow
                      if (k := self._unwrap(d, rp_id_hash)) is not None), None)
        up = options.get("up", True)
        if up:
            self._user_present(event, on_keepalive)
        if found is None:  # no resident keys: without a matching allow-list entry, nothing
            raise _Reject(ERR.NO_CREDENTIALS)
        cred_id, (alg, key) = found
        flags = AuthenticatorData.FLAG.UP if up else AuthenticatorData.FLAG(0)
        auth_data = AuthenticatorData.create(rp_id_hash, flags, self._secret.next_counter())
        signature = _sign(alg, key, bytes(auth_data) + client_data_hash)
        return {1: {"id": cred_id, "type": "public-key"}, 2: bytes(auth_data), 3: signature}

    # -- credential wrapping -------------------------------------------------------------

    def _wrap(self, alg: int, secret: bytes, rp_id_hash: bytes) -> bytes:
        nonce = os.urandom(12)
        header = bytes([_WRAP_VERSION])
        sealed = AESGCM(self._secret.wrap_key).encrypt(
            nonce, bytes([_ALG_CODES[alg]]) + secret, header + rp_id_hash)
        return header + nonce + sealed

    def _unwrap(self, descriptor: Any, rp_id_hash: bytes) -> tuple[int, Any] | None:
        """The credential's (alg, private key) if this device made it for this RP, else None."""
        if not isinstance(descriptor, dict) or descriptor.get("type") != "public-key":
            return None
        cred_id = descriptor.get("id")
        if not isinstance(cred_id, bytes) or len(cred_id) != 1 + 12 + 1 + 32 + 16:
            return None
        if cred_id[0] != _WRAP_VERSION:
            return None
        try:
            plain = AESGCM(self._secret.wrap_key).decrypt(
                cred_id[1:13], cred_id[13:], cred_id[:1] + rp_id_hash)
        except InvalidTag:
            return None
        code, secret = plain[0], plain[1:]
        if code == _ALG_CODES[ES256.ALGORITHM]:
            return ES256.ALGORITHM, ec.derive_private_key(int.from_bytes(secret, "big"),
                                                          ec.SECP256R1())
        if code == _ALG_CODES[EdDSA.ALGORITHM]:
            return EdDSA.ALGORITHM, Ed25519PrivateKey.from_private_bytes(secret)
        return None


def _sign(alg: int, key: Any, message: bytes) -> bytes:
    if alg == ES256.ALGORITHM:
        return key.sign(message, ec.ECDSA(hashes.SHA256()))
    return key.sign(message)
