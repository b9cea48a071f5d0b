"""The owner ceremony end to end: unmodified Fido2Client + software key, Fido2Server checks."""

from __future__ import annotations

import glob
import struct
from dataclasses import replace

import fido2.hid
import pytest
from fido2.client import DefaultClientDataCollector, Fido2Client
from fido2.server import Fido2Server
from fido2.webauthn import (
    AttestationConveyancePreference,
    AuthenticatorData,
    CollectedClientData,
    PublicKeyCredentialRpEntity,
    PublicKeyCredentialUserEntity,
)

from identity import (
    NO_KEY_MESSAGE,
    Authenticator,
    CounterRegression,
    MalformedStatement,
    NoAuthenticator,
    OwnerKeySpecError,
    SignatureError,
    SoftAuthenticator,
    TamperedStatement,
    TerminalInteraction,
    UserNotPresent,
    WrongRelyingParty,
    digest,
    enrol,
    open_authenticator,
    verify_proof,
)
from tests.conftest import no_install_fixes
from tests.identity_support import CountingInteraction, owner_key


def test_plain_fido2_client_and_server_accept_the_software_key(tmp_path):
    """No identity code in the loop: fido2's own client and server, the software device."""
    device = SoftAuthenticator(tmp_path / "k")
    rp = PublicKeyCredentialRpEntity(name="swarm", id="swarm.localhost")
    server = Fido2Server(rp, attestation=AttestationConveyancePreference.DIRECT)
    client = Fido2Client(device, DefaultClientDataCollector("http://swarm.localhost"))
    user = PublicKeyCredentialUserEntity(id=b"owner", name="owner")
    options, state = server.register_begin(user)
    auth_data = server.register_complete(state, client.make_credential(options.public_key))
    cred = auth_data.credential_data
    options, state = server.authenticate_begin([cred])
    response = client.get_assertion(options.public_key).get_response(0)
    assert server.authenticate_complete(state, [cred], response).credential_id == \
        cred.credential_id


@pytest.mark.parametrize("alg", [-7, -8])
def test_enrol_and_assert_round_trip(tmp_path, alg):
    key = owner_key(tmp_path, "owner", algorithms=[alg])
    cred = key.credential
    assert cred.public_key[3] == alg
    assert cred.attestation == "self" and cred.hardware_backed is False
    proof = key.proof(b"statement bytes")
    assert CollectedClientData(proof.client_data).challenge == digest(b"statement bytes")
    counter = verify_proof(cred, b"statement bytes", proof, last_counter=0)
    assert counter == proof.counter > 0


def test_software_key_is_never_hardware_backed(tmp_path):
    """Even wrapped as if it were a device, self attestation keeps it software."""
    auth = Authenticator(SoftAuthenticator(tmp_path / "k"), "lying", True,
                         CountingInteraction())
    assert enrol(auth).hardware_backed is False


def test_tampered_statement_is_refused(tmp_path):
    key = owner_key(tmp_path, "owner")
    proof = key.proof(b"block peer A")
    with pytest.raises(TamperedStatement):
        verify_proof(key.credential, b"block peer B", proof, last_counter=0)


def test_wrong_rp_id_is_refused(tmp_path):
    key = owner_key(tmp_path, "owner", rp_id="evil.localhost", origin="http://evil.localhost")
    proof = key.proof(b"s", rp_id="evil.localhost", origin="http://evil.localhost")
    with pytest.raises(WrongRelyingParty, match="origin"):
        verify_proof(key.credential, b"s", proof, last_counter=0)
    with pytest.raises(WrongRelyingParty, match="RP id"):
        verify_proof(key.credential, b"s", proof, last_counter=0,
                     origin="http://evil.localhost")


def test_wrong_origin_is_refused(tmp_path):
    key = owner_key(tmp_path, "owner")
    # a sibling origin that fido2's client accepts for this RP id, but not ours
    proof = key.proof(b"s", origin="http://phish.swarm.localhost")
    with pytest.raises(WrongRelyingParty, match="phish"):
        verify_proof(key.credential, b"s", proof, last_counter=0)


def test_counter_regression_and_replay_are_refused(tmp_path):
    key = owner_key(tmp_path, "owner")
    older = key.proof(b"s")
    newer = key.proof(b"s")
    last = verify_proof(key.credential, b"s", newer, last_counter=0)
    with pytest.raises(CounterRegression):
        verify_proof(key.credential, b"s", older, last_counter=last)
    with pytest.raises(CounterRegression):
        verify_proof(key.credential, b"s", newer, last_counter=last)  # the same proof again


def test_bad_signature_and_wrong_credential_are_refused(tmp_path):
    key = owner_key(tmp_path, "owner")
    other = owner_key(tmp_path, "other")
    proof = key.proof(b"s")
    sig = bytearray(proof.signature)
    sig[-1] ^= 1
    with pytest.raises(SignatureError, match="does not verify"):
        verify_proof(key.credential, b"s", replace(proof, signature=bytes(sig)), last_counter=0)
    with pytest.raises(SignatureError, match="not"):
        verify_proof(other.credential, b"s", proof, last_counter=0)
    # same credential id, other public key: the signature cannot verify
    forged = replace(other.credential, credential_id=key.credential.credential_id)
    with pytest.raises(SignatureError):
        verify_proof(forged, b"s", proof, last_counter=0)


def test_missing_user_presence_is_refused(tmp_path):
    key = owner_key(tmp_path, "owner")
    proof = key.proof(b"s")
    ad = AuthenticatorData(proof.authenticator_data)
    no_up = AuthenticatorData.create(ad.rp_id_hash, AuthenticatorData.FLAG(0), ad.counter)
    with pytest.raises(UserNotPresent):
        verify_proof(key.credential, b"s", replace(proof, authenticator_data=bytes(no_up)),
                     last_counter=0)


def test_registration_client_data_is_not_an_assertion(tmp_path):
    key = owner_key(tmp_path, "owner")
    proof = key.proof(b"s")
    created = CollectedClientData.create("webauthn.create", digest(b"s"),
                                         "http://swarm.localhost")
    with pytest.raises(WrongRelyingParty, match="webauthn.create"):
        verify_proof(key.credential, b"s", replace(proof, client_data=bytes(created)),
                     last_counter=0)


@pytest.mark.parametrize("field, value", [
    ("authenticator_data", b"\x00" * 36),   # truncated authenticatorData
    ("authenticator_data", b"\x00" * 32 + struct.pack(">BI", 0x41, 1)),  # AT flag, no data
    ("client_data", b"{not json"),
    ("client_data", b'{"type":"webauthn.get"}'),
])
def test_unparseable_proofs_are_malformed(tmp_path, field, value):
    key = owner_key(tmp_path, "owner")
    proof = replace(key.proof(b"s"), **{field: value})
    with pytest.raises(MalformedStatement):
        verify_proof(key.credential, b"s", proof, last_counter=0)


def test_fido2_spec_without_a_key_refuses_clearly(monkeypatch):
    monkeypatch.setattr(fido2.hid.CtapHidDevice, "list_devices", classmethod(lambda cls: iter(())))
    with pytest.raises(NoAuthenticator) as info:
        open_authenticator("fido2")
    assert str(info.value) == NO_KEY_MESSAGE
    assert "plug in your key" in str(info.value) and "soft:PATH" in str(info.value)


@pytest.mark.skipif(bool(glob.glob("/dev/hidraw*")), reason=no_install_fixes("a HID device is present here"))
def test_fido2_spec_on_this_machine_finds_no_key():
    with pytest.raises(NoAuthenticator, match="udev rule"):
        open_authenticator("fido2")


@pytest.mark.parametrize("spec", ["yubikey", "soft:", "", "fido"])
def test_bad_owner_key_specs(spec):
    with pytest.raises(OwnerKeySpecError):
        open_authenticator(spec)


def test_soft_spec_opens_a_software_key(tmp_path):
    auth = open_authenticator(f"soft:{tmp_path / 'owner.key'}")
    assert auth.hardware_backed is False
    assert isinstance(auth.device, SoftAuthenticator)
    assert "not hardware-backed" in auth.description


def test_terminal_interaction_prompts_on_stderr_and_asks_pin_with_getpass(capsys,
                                                                          monkeypatch):
    asked = []
    monkeypatch.setattr("getpass.getpass", lambda prompt: asked.append(prompt) or "1234")
    ui = TerminalInteraction()
    ui.prompt_up()
    assert "touch your security key" in capsys.readouterr().err
    assert ui.request_pin(None, "swarm.localhost") == "1234" and asked


def test_enrol_refuses_other_algorithms(tmp_path):
    auth = open_authenticator(f"soft:{tmp_path / 'owner.key'}")
    with pytest.raises(ValueError, match="ES256"):
        enrol(auth, algorithms=[-257])
