"""The FIDO2 owner ceremony, through fido2's own ``Fido2Client`` and ``Fido2Server``.

Enrol makes a credential on the owner's authenticator; assert signs a statement by making
the assertion's challenge the SHA-256 of the statement's canonical encoding; verify checks
that assertion with ``Fido2Server.authenticate_complete`` (RP id, origin, type, UP flag,
signature) plus the sign counter, which fido2's server leaves to the relying party.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric import ec
from fido2 import cbor
from fido2.attestation import Attestation, AttestationType
from fido2.attestation.base import InvalidAttestation
from fido2.client import ClientError, DefaultClientDataCollector, Fido2Client
from fido2.cose import ES256, CoseKey, EdDSA
from fido2.ctap import CtapError
from fido2.server import Fido2Server
from fido2.webauthn import (
    AttestationConveyancePreference,
    AttestedCredentialData,
    AuthenticationResponse,
    AuthenticatorAssertionResponse,
    AuthenticatorAttachment,
    AuthenticatorData,
    CollectedClientData,
    PublicKeyCredentialParameters,
    PublicKeyCredentialRpEntity,
    PublicKeyCredentialType,
    PublicKeyCredentialUserEntity,
    UserVerificationRequirement,
)

from identity.authenticators import Authenticator
from identity.errors import (
    AuthenticatorError,
    CounterRegression,
    MalformedStatement,
    SignatureError,
    TamperedStatement,
    UserNotPresent,
    WrongRelyingParty,
)
from identity.softkey import SOFT_AAGUID

RP_ID = "swarm.localhost"
"""The relying party every swarm uses; the statement itself names the swarm."""
ORIGIN = "http://swarm.localhost"
"""The WebAuthn origin of the ceremony (fido2 accepts http for a .localhost RP id)."""
ALGORITHMS = (ES256.ALGORITHM, EdDSA.ALGORITHM)
"""COSE algorithms an owner credential may use, in order of preference."""

_ATTESTATION_NAMES = {AttestationType.NONE: "none", AttestationType.BASIC: "basic",
                      AttestationType.SELF: "self", AttestationType.ATT_CA: "attca",
                      AttestationType.ANON_CA: "anonca"}
_VENDOR_ATTESTATION = {"basic", "attca", "anonca"}
_MAX_CRED_ID = 255
_MAX_AUTH_DATA = 512
_MAX_CLIENT_DATA = 512
_MAX_SIGNATURE = 128
_MAX_CHALLENGE_CHARS = 86  # base64url of a SHA-256 digest is 43; leave room, refuse more


class Signable(Protocol):
    """Anything with a canonical encoding: the statements of :mod:`identity.statements`."""

    def encode(self) -> bytes: ...


def digest(statement: Signable | bytes) -> bytes:
    """The challenge an owner signs for ``statement``: SHA-256 of its canonical encoding."""
    data = statement if isinstance(statement, bytes) else statement.encode()
    return hashlib.sha256(data).digest()


# -- credential and proof ------------------------------------------------------------------


@dataclass(frozen=True)
class OwnerCredential:
    """An enrolled owner key, as a statement carries it (compact: about 180 bytes)."""

    credential_id: bytes
    """The authenticator's handle for the key (for a security key, usually 64 bytes)."""
    public_key: CoseKey
    """The credential's COSE public key (ES256 or EdDSA)."""
    aaguid: bytes
    """The authenticator model's AAGUID (16 bytes; the software key has its own)."""
    attestation: str
    """Attestation type seen at enrolment: none, self, basic, attca or anonca."""
    hardware_backed: bool
    """A vendor-attested security key; never true for the software authenticator."""

    def to_cbor(self) -> dict[int, Any]:
        return {1: self.credential_id, 2: dict(self.public_key), 3: self.aaguid,
                4: self.attestation, 5: self.hardware_backed}

    @classmethod
    def from_cbor(cls, m: Any) -> OwnerCredential:
        if not isinstance(m, dict) or set(m) != {1, 2, 3, 4, 5}:
            raise MalformedStatement("owner credential: expected fields 1-5")
        cred_id, cose, aaguid, att, hw = m[1], m[2], m[3], m[4], m[5]
        if not isinstance(cred_id, bytes) or not 1 <= len(cred_id) <= _MAX_CRED_ID:
            raise MalformedStatement("owner credential: bad credential id")
        if not isinstance(aaguid, bytes) or len(aaguid) != 16:
            raise MalformedStatement("owner credential: AAGUID must be 16 bytes")
        if att not in _ATTESTATION_NAMES.values() or not isinstance(hw, bool):
            raise MalformedStatement("owner credential: bad attestation type or flag")
        if hw and (aaguid == bytes(SOFT_AAGUID) or att not in _VENDOR_ATTESTATION):
            raise MalformedStatement("owner credential: claims hardware without vendor "
                                     "attestation (or is the software key)")
        return cls(cred_id, check_cose_key(cose), aaguid, att, hw)

    def attested(self) -> AttestedCredentialData:
        """The form fido2's server wants in its credential list."""
        return AttestedCredentialData.create(self.aaguid, self.credential_id, self.public_key)

    def same_key(self, other: OwnerCredential) -> bool:
        return (self.credential_id == other.credential_id
                and dict(self.public_key) == dict(other.public_key))

    def fingerprint(self) -> bytes:
        """16 bytes naming this key (credential id and public key), short enough for a URI."""
        return hashlib.sha256(cbor.encode([self.credential_id, dict(self.public_key)])).digest()[:16]

    def short(self) -> str:
        return self.fingerprint().hex()[:12]


def check_cose_key(m: Any) -> CoseKey:
    """A COSE public key of an allowed algorithm, with a valid point; else MalformedStatement."""
    if not isinstance(m, dict):
        raise MalformedStatement("COSE key: not a map")
    if m == {1: 2, 3: ES256.ALGORITHM, -1: 1, -2: m.get(-2), -3: m.get(-3)} and all(
            isinstance(m[k], bytes) and len(m[k]) == 32 for k in (-2, -3)):
        try:
            ec.EllipticCurvePublicNumbers(int.from_bytes(m[-2], "big"),
                                          int.from_bytes(m[-3], "big"),
                                          ec.SECP256R1()).public_key()
        except ValueError as exc:
            raise MalformedStatement("COSE key: ES256 point not on the curve") from exc
        return ES256(m)
    if m == {1: 1, 3: EdDSA.ALGORITHM, -1: 6, -2: m.get(-2)} and isinstance(m[-2], bytes) \
            and len(m[-2]) == 32:
        return EdDSA(m)
    raise MalformedStatement("COSE key: only ES256 (P-256) and EdDSA (Ed25519) keys are allowed")


@dataclass(frozen=True)
class OwnerProof:
    """An owner's FIDO2 assertion over one statement (about 280 bytes encoded)."""

    credential_id: bytes
    """Which owner credential signed."""
    authenticator_data: bytes
    """authenticatorData: RP id hash, flags (UP), sign counter."""
    client_data: bytes
    """clientDataJSON exactly as signed: type, challenge (the statement digest), origin."""
    signature: bytes
    """The credential's signature over authenticatorData + SHA-256(clientDataJSON)."""

    KIND = 0

    def to_cbor(self) -> dict[int, Any]:
        return {0: self.KIND, 1: self.credential_id, 2: self.authenticator_data,
                3: self.client_data, 4: self.signature}

    @classmethod
    def from_cbor(cls, m: Any) -> OwnerProof:
        if not isinstance(m, dict) or set(m) != {0, 1, 2, 3, 4} or m[0] != cls.KIND:
            raise MalformedStatement("owner proof: expected fields 0-4")
        limits = {1: _MAX_CRED_ID, 2: _MAX_AUTH_DATA, 3: _MAX_CLIENT_DATA, 4: _MAX_SIGNATURE}
        for key, limit in limits.items():
            if not isinstance(m[key], bytes) or not 1 <= len(m[key]) <= limit:
                raise MalformedStatement(f"owner proof: field {key} must be 1-{limit} bytes")
        proof = cls(m[1], m[2], m[3], m[4])
        proof.parsed()  # refuse unparseable authenticatorData / clientDataJSON early
        return proof

    def parsed(self) -> tuple[AuthenticatorData, CollectedClientData]:
        _check_client_data_fields(self.client_data)
        try:
            auth_data = AuthenticatorData(self.authenticator_data)
            client_data = CollectedClientData(self.client_data)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError,
                struct.error) as exc:
            raise MalformedStatement(f"owner proof: unparseable authenticator or client "
                                     f"data: {exc}") from exc
        if not isinstance(client_data.origin, str) or not isinstance(client_data.type, str):
            raise MalformedStatement("owner proof: client data without origin or type")
        return auth_data, client_data

    @property
    def counter(self) -> int:
        return self.parsed()[0].counter


def _check_client_data_fields(raw: bytes) -> None:
    """Type-check clientDataJSON before fido2 sees it.

    fido2's CollectedClientData passes ``challenge`` to ``bytes()``: an integer there would
    allocate that many bytes (a 26 GB allocation from a 40-byte proof, found by fuzzing).
    """
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise MalformedStatement(f"owner proof: client data is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise MalformedStatement("owner proof: client data is not a JSON object")
    for key in ("type", "challenge", "origin"):
        if not isinstance(data.get(key), str):
            raise MalformedStatement(f"owner proof: client data field {key!r} must be a string")
    if len(data["challenge"]) > _MAX_CHALLENGE_CHARS:
        raise MalformedStatement("owner proof: client data challenge is too long")


# -- the ceremonies ------------------------------------------------------------------------


def _server(rp_id: str, origin: str, algorithms: Sequence[int] = ALGORITHMS) -> Fido2Server:
    server = Fido2Server(PublicKeyCredentialRpEntity(name="swarm", id=rp_id),
                         attestation=AttestationConveyancePreference.DIRECT,
                         verify_origin=lambda o: o == origin)
    server.allowed_algorithms = [
        PublicKeyCredentialParameters(type=PublicKeyCredentialType.PUBLIC_KEY, alg=alg)
        for alg in algorithms]
    return server


def _client(authenticator: Authenticator, origin: str) -> Fido2Client:
    try:
        return Fido2Client(authenticator.device, DefaultClientDataCollector(origin),
                           user_interaction=authenticator.interaction)
    except (CtapError, OSError) as exc:
        raise AuthenticatorError(f"{authenticator.description}: cannot talk to it: "
                                 f"{exc}") from exc


def enrol(authenticator: Authenticator, *, rp_id: str = RP_ID, origin: str = ORIGIN,
          user_name: str = "swarm owner",
          algorithms: Sequence[int] = ALGORITHMS) -> OwnerCredential:
    """Make a new owner credential on ``authenticator`` (the user touches the key).

    ``algorithms``: COSE algorithm ids to offer, preferred first (ES256, EdDSA).
    """
    if not algorithms or not set(algorithms) <= set(ALGORITHMS):
        raise ValueError(f"owner keys use ES256 ({ES256.ALGORITHM}) or EdDSA "
                         f"({EdDSA.ALGORITHM}), not {list(algorithms)}")
    server = _server(rp_id, origin, algorithms)
    options, state = server.register_begin(
        PublicKeyCredentialUserEntity(id=hashlib.sha256(user_name.encode()).digest()[:16],
                                      name=user_name, display_name=user_name),
        user_verification=UserVerificationRequirement.DISCOURAGED,
        authenticator_attachment=AuthenticatorAttachment.CROSS_PLATFORM)
    client = _client(authenticator, origin)
    try:
        response = client.make_credential(options.public_key)
    except ClientError as exc:
        raise AuthenticatorError(f"{authenticator.description}: enrolment failed: "
                                 f"{exc.code.name} {exc.cause or ''}".rstrip()) from exc
    try:
        auth_data = server.register_complete(state, response)
    except ValueError as exc:
        raise SignatureError(f"enrolment response does not verify: {exc}") from exc
    att_obj = response.response.attestation_object
    try:
        result = Attestation.for_type(att_obj.fmt)().verify(
            att_obj.att_stmt, att_obj.auth_data, response.response.client_data.hash)
    except InvalidAttestation as exc:
        raise SignatureError(f"attestation ({att_obj.fmt}) does not verify: {exc}") from exc
    cred = auth_data.credential_data
    assert cred is not None  # noqa: S101 - register_complete guarantees AT data
    attestation = _ATTESTATION_NAMES[result.attestation_type]
    hardware = (authenticator.hardware_backed and attestation in _VENDOR_ATTESTATION
                and bytes(cred.aaguid) != bytes(SOFT_AAGUID))
    return OwnerCredential(cred.credential_id, check_cose_key(dict(cred.public_key)),
                           bytes(cred.aaguid), attestation, hardware)


def assert_statement(authenticator: Authenticator, credential: OwnerCredential,
                     statement: Signable | bytes, *, rp_id: str = RP_ID,
                     origin: str = ORIGIN) -> OwnerProof:
    """Have the owner sign ``statement``: an assertion whose challenge is its digest."""
    server = _server(rp_id, origin)
    options, _state = server.authenticate_begin(
        [credential.attested()], user_verification=UserVerificationRequirement.DISCOURAGED,
        challenge=digest(statement))
    client = _client(authenticator, origin)
    try:
        response = client.get_assertion(options.public_key).get_response(0)
    except ClientError as exc:
        raise AuthenticatorError(f"{authenticator.description}: signing failed: "
                                 f"{exc.code.name} {exc.cause or ''}".rstrip()) from exc
    assertion = response.response
    return OwnerProof(response.raw_id, bytes(assertion.authenticator_data),
                      bytes(assertion.client_data), assertion.signature)


def verify_proof(credential: OwnerCredential, statement: Signable | bytes, proof: OwnerProof,
                 *, last_counter: int, rp_id: str = RP_ID, origin: str = ORIGIN) -> int:
    """Check ``proof`` is ``credential``'s assertion over ``statement``; return its counter.

    The counter must exceed ``last_counter`` (the highest seen for this credential), unless
    both are 0: WebAuthn lets authenticators without a counter always report 0.
    """
    if proof.credential_id != credential.credential_id:
        raise SignatureError(f"proof is by credential {proof.credential_id.hex()[:12]}, "
                             f"not {credential.credential_id.hex()[:12]}")
    auth_data, client_data = proof.parsed()
    expected = digest(statement)
    # The specific checks first, for a specific error; fido2's server re-checks them all.
    if client_data.type != CollectedClientData.TYPE.GET:
        raise WrongRelyingParty(f"proof is a {client_data.type!r} ceremony, not webauthn.get")
    if client_data.origin != origin:
        raise WrongRelyingParty(f"proof was made for origin {client_data.origin!r}, "
                                f"not {origin!r}")
    if auth_data.rp_id_hash != hashlib.sha256(rp_id.encode()).digest():
        raise WrongRelyingParty(f"proof was made for another RP id than {rp_id!r}")
    if client_data.challenge != expected:
        raise TamperedStatement("proof was made over a different statement "
                                "(the statement was altered, or the proof belongs elsewhere)")
    if not auth_data.is_user_present():
        raise UserNotPresent("proof lacks the user-present flag (the key was not touched)")
    server = _server(rp_id, origin)
    _options, state = server.authenticate_begin([credential.attested()], challenge=expected)
    response = AuthenticationResponse(
        raw_id=proof.credential_id,
        response=AuthenticatorAssertionResponse(client_data=client_data,
                                                authenticator_data=auth_data,
                                                signature=proof.signature))
    try:
        server.authenticate_complete(state, [credential.attested()], response)
    except ValueError as exc:
        raise SignatureError(f"owner proof does not verify: {exc}") from exc
    counter = auth_data.counter
    if counter <= last_counter and not (counter == 0 and last_counter == 0):
        raise CounterRegression(f"sign counter {counter} is not above {last_counter}: a "
                                "replayed proof or a cloned authenticator")
    return counter
