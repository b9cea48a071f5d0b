"""The software CTAP2 authenticator, spoken to over raw CTAP2 as fido2's Ctap2 does."""

from __future__ import annotations

import hashlib
import stat

import pytest
from fido2 import cbor
from fido2.ctap import CtapError
from fido2.ctap2 import Ctap2
from fido2.hid import CTAPHID

from identity import (
    SOFT_AAGUID,
    AuthenticatorError,
    KeyFileError,
    SoftAuthenticator,
    assert_statement,
    enrol,
)
from tests.identity_support import owner_key, soft_authenticator

ERR = CtapError.ERR


def _mc_params(extra=None):
    params = {1: b"\x11" * 32, 2: {"id": "swarm.localhost", "name": "swarm"},
              3: {"id": b"u", "name": "u"}, 4: [{"alg": -7, "type": "public-key"}]}
    params.update(extra or {})
    return params


def _raw(dev, command: int, params=None) -> bytes:
    body = bytes([command]) + (cbor.encode(params) if params is not None else b"")
    return dev.call(CTAPHID.CBOR, body)


def test_get_info_is_canonical_and_describes_a_software_key(tmp_path):
    ctap = Ctap2(SoftAuthenticator(tmp_path / "k"))  # strict_cbor: refuses non-canonical
    info = ctap.info
    assert bytes(info.aaguid) == bytes(SOFT_AAGUID)
    assert info.max_cred_id_length >= 62  # our credential ids must not be filtered out
    assert {a["alg"] for a in info.algorithms} == {-7, -8}
    assert "uv" not in info.options and "clientPin" not in info.options
    assert info.options["up"] is True and info.options["rk"] is False


def test_secret_file_is_created_0600_and_loose_files_are_refused(tmp_path):
    path = tmp_path / "deep" / "owner.key"
    SoftAuthenticator(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    path.chmod(0o640)
    with pytest.raises(KeyFileError, match="chmod 600"):
        SoftAuthenticator(path)
    path.chmod(0o604)
    with pytest.raises(KeyFileError, match="must be 600"):
        SoftAuthenticator(path)


def test_corrupt_secret_file_is_refused(tmp_path):
    path = tmp_path / "owner.key"
    path.write_bytes(b"\xa1\x01")
    path.chmod(0o600)
    with pytest.raises(KeyFileError):
        SoftAuthenticator(path)
    path.write_bytes(cbor.encode({1: 1, 2: b"short", 3: 0}))
    with pytest.raises(KeyFileError, match="not a swarm software key"):
        SoftAuthenticator(path)


def test_sign_counter_is_persisted_across_reopen(tmp_path):
    key = owner_key(tmp_path, "owner")
    first = assert_statement(key.authenticator, key.credential, b"one").counter
    reopened = soft_authenticator(tmp_path / "owner.key")
    second = assert_statement(reopened, key.credential, b"two").counter
    assert second > first > 0


def test_user_presence_is_requested_through_keepalive(tmp_path):
    auth = soft_authenticator(tmp_path / "k")
    cred = enrol(auth)
    assert auth.interaction.prompts == 1
    assert_statement(auth, cred, b"x")
    assert auth.interaction.prompts == 2  # the allow-list probe (up=False) does not prompt


def test_denied_presence_fails_the_ceremony(tmp_path):
    auth = soft_authenticator(tmp_path / "k", presence=lambda: False)
    with pytest.raises(AuthenticatorError, match="enrolment failed"):
        enrol(auth)


def test_credential_of_another_key_file_or_rp_is_not_usable(tmp_path):
    key = owner_key(tmp_path, "a")
    other = soft_authenticator(tmp_path / "b.key")
    with pytest.raises(AuthenticatorError, match="signing failed"):
        assert_statement(other, key.credential, b"x")
    with pytest.raises(AuthenticatorError, match="signing failed"):
        assert_statement(key.authenticator, key.credential, b"x", rp_id="other.localhost",
                         origin="http://other.localhost")


@pytest.mark.parametrize("body, code", [
    (b"\x04\xff", ERR.INVALID_CBOR),                       # truncated / invalid CBOR
    (b"\x01" + bytes.fromhex("b90001") + b"\x01\x01", ERR.INVALID_CBOR),  # non-minimal length
    (b"\x01\x01", ERR.INVALID_CBOR),                        # not a map
    (b"\x09", ERR.INVALID_COMMAND),                        # unknown CTAP2 command
    (b"\x06", ERR.INVALID_COMMAND),                        # clientPin: no PIN support
    (b"", ERR.INVALID_LENGTH),
    (b"\x02" + b"\xa0" * 2000, ERR.REQUEST_TOO_LARGE),
])
def test_bad_requests_get_ctap_errors(tmp_path, body, code):
    dev = SoftAuthenticator(tmp_path / "k")
    assert dev.call(CTAPHID.CBOR, body) == bytes([code])


def test_make_credential_refusals(tmp_path):
    dev = SoftAuthenticator(tmp_path / "k")
    assert _raw(dev, 1, {1: b"\x11" * 32}) == bytes([ERR.MISSING_PARAMETER])
    assert _raw(dev, 1, _mc_params({1: "text"})) == bytes([ERR.CBOR_UNEXPECTED_TYPE])
    assert _raw(dev, 1, _mc_params({7: {"rk": True}})) == bytes([ERR.UNSUPPORTED_OPTION])
    assert _raw(dev, 1, _mc_params({7: {"uv": True}})) == bytes([ERR.INVALID_OPTION])
    rsa_only = _mc_params({4: [{"alg": -257, "type": "public-key"}]})
    assert _raw(dev, 1, rsa_only) == bytes([ERR.UNSUPPORTED_ALGORITHM])
    assert _raw(dev, 1, _mc_params({8: b""})) == bytes([ERR.PIN_NOT_SET])
    assert _raw(dev, 1, _mc_params({8: b"x" * 16})) == bytes([ERR.PIN_AUTH_INVALID])


def test_make_credential_then_exclude_and_assert_over_raw_ctap2(tmp_path):
    dev = SoftAuthenticator(tmp_path / "k")
    ctap = Ctap2(dev)
    att = ctap.make_credential(b"\x11" * 32, {"id": "swarm.localhost", "name": "s"},
                               {"id": b"u", "name": "u"}, [{"alg": -8, "type": "public-key"}])
    assert att.fmt == "packed" and set(att.att_stmt) == {"alg", "sig"}  # self attestation
    cred = att.auth_data.credential_data
    assert cred.public_key[3] == -8
    descriptor = {"id": cred.credential_id, "type": "public-key"}
    with pytest.raises(CtapError) as info:
        ctap.make_credential(b"\x11" * 32, {"id": "swarm.localhost", "name": "s"},
                             {"id": b"u", "name": "u"}, [{"alg": -7, "type": "public-key"}],
                             exclude_list=[descriptor])
    assert info.value.code == ERR.CREDENTIAL_EXCLUDED
    assertion = ctap.get_assertion("swarm.localhost", b"\x22" * 32, [descriptor])
    assertion.verify(b"\x22" * 32, cred.public_key)
    assert assertion.auth_data.counter > att.auth_data.counter
    assert assertion.auth_data.rp_id_hash == hashlib.sha256(b"swarm.localhost").digest()
    with pytest.raises(CtapError) as info:
        ctap.get_assertion("swarm.localhost", b"\x22" * 32)  # no resident keys
    assert info.value.code == ERR.NO_CREDENTIALS


def test_non_cbor_transport_commands_are_refused(tmp_path):
    dev = SoftAuthenticator(tmp_path / "k")
    with pytest.raises(CtapError):
        dev.call(CTAPHID.MSG, b"\x00")
    assert list(SoftAuthenticator.list_devices()) == []


def test_two_opens_of_one_key_file_never_reuse_a_counter(tmp_path):
    key = owner_key(tmp_path, "owner")
    twin = soft_authenticator(tmp_path / "owner.key")
    counters = []
    for auth in (key.authenticator, twin, key.authenticator, twin):
        counters.append(assert_statement(auth, key.credential, b"s").counter)
    assert counters == sorted(set(counters))
