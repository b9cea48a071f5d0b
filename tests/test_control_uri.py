"""Join URIs: round trip, the BEP 44 target, and bad URIs naming the wrong part."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarm import uri
from swarm.errors import ConfigError, URIError

KEY = bytes(range(32))

hosts = st.one_of(
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(str),
    st.from_regex(r"\A[a-z][a-z0-9]{0,10}(\.[a-z][a-z0-9]{0,10}){0,3}\Z"),
)
join_uris = st.builds(
    uri.JoinURI,
    pubkey=st.binary(min_size=32, max_size=32),
    name=st.text(st.characters(codec="utf-8", categories=["L", "N", "P", "S"],
                                 include_characters=" "),
                 max_size=uri.MAX_NAME),
    salt=st.binary(max_size=uri.MAX_SALT),
    peers=st.lists(st.tuples(hosts, st.integers(1, 65535)), max_size=uri.MAX_PEERS).map(tuple),
    owner=st.sampled_from([b"", bytes(range(16))]),
)


@given(join_uris)
def test_round_trip(j):
    text = str(j)
    assert text.startswith("magnet:?xs=urn:btpk:")
    assert uri.parse(text, require_owner=bool(j.owner)) == j
    if not j.owner:
        with pytest.raises(URIError, match="x.op: missing"):
            uri.parse(text)


PARTS = ("xs", "s", "dn", "x.op", "x.pe")


def _names_a_part(text: str, exc: URIError) -> None:
    """The error says which part of ``text`` is wrong: a named parameter, a parameter with no
    value, the length, or that it is no join URI at all (the prefix)."""
    msg = str(exc)
    part, sep, _ = msg.partition(": ")
    if sep and part in PARTS:
        return
    if sep and msg.endswith("percent-escapes are not UTF-8"):
        assert f"{part}=" in text, msg          # the parameter whose value is bad
        return
    assert (msg.startswith(("parameter ", "join URI longer than"))
            or "is not a join URI: expected magnet:?xs=urn:btpk:" in msg), msg


@given(st.text(max_size=300))
def test_garbage_raises_uri_error_only(text):
    """Any text parses or raises URIError (never another exception), and the error names a
    part."""
    try:
        uri.parse(text)
    except URIError as exc:
        _names_a_part(text, exc)


@given(join_uris, st.integers(0, 400), st.text(max_size=5))
def test_mutated_uri_parses_or_names_a_part(j, pos, junk):
    text = str(j)
    pos = min(pos, len(text))
    mutated = text[:pos] + junk + text[pos:]
    try:
        uri.parse(mutated)
    except URIError as exc:
        _names_a_part(mutated, exc)


@pytest.mark.parametrize(("text", "part"), [
    ("magnet:?xs=urn:btpk:00", "xs: public key has 2 hex digits"),
    (f"magnet:?xs=urn:btpk:{KEY.hex()}&s=zz&x.op={'ab' * 16}", "s: 'zz' is not hex"),
    (f"magnet:?xs=urn:btpk:{KEY.hex()}&x.pe=h:0&x.op={'ab' * 16}", "x.pe: port 0 out of range"),
    (f"magnet:?xs=urn:btpk:{KEY.hex()}&dn=%ff&x.op={'ab' * 16}", "dn: percent-escapes"),
    (f"magnet:?xs=urn:btpk:{KEY.hex()}&x.op=ab", "x.op: the owner pin is 16 bytes"),
    (f"magnet:?xs=urn:btpk:{KEY.hex()}&dn", "parameter 'dn' has no '=value'"),
    ("http://example.org/", "is not a join URI"),
])
def test_bad_uris_name_their_part(text, part):
    with pytest.raises(URIError) as info:
        uri.parse(text)
    assert part in str(info.value)
    _names_a_part(text, info.value)


def test_swarm_id_is_the_bep44_target():
    j = uri.JoinURI(pubkey=KEY, name="lab")
    assert j.swarm_id == hashlib.sha1(KEY + b"swarm").digest()
    assert uri.parse(str(j), require_owner=False).salt == b"swarm"


def test_example_parses():
    text = (f"magnet:?xs=urn:btpk:{KEY.hex()}&s=737761726d&dn=my%20lab"
            "&x.pe=127.0.0.1:4000&x.pe=[::1]:4001&x.pe=node.example.org:4002&tr=ignored"
            f"&x.op={'ab' * 16}")
    j = uri.parse(text)
    assert j.name == "my lab"
    assert j.peers == (("127.0.0.1", 4000), ("::1", 4001), ("node.example.org", 4002))


@pytest.mark.parametrize(
    ("text", "part"),
    [
        ("http://example.org", "magnet"),
        ("magnet:?dn=x", "xs: missing"),
        ("magnet:?xs=urn:btih:" + "00" * 32, "xs:"),
        ("magnet:?xs=urn:btpk:" + "00" * 31, "64"),
        ("magnet:?xs=urn:btpk:" + "zz" * 32, "xs:"),
        (f"magnet:?xs=urn:btpk:{KEY.hex()}&s=xyz", "s:"),
        (f"magnet:?xs=urn:btpk:{KEY.hex()}&s=" + "00" * 65, "s:"),
        (f"magnet:?xs=urn:btpk:{KEY.hex()}&dn=" + "a" * 101, "dn:"),
        (f"magnet:?xs=urn:btpk:{KEY.hex()}&dn=%07bell", "dn:"),
        (f"magnet:?xs=urn:btpk:{KEY.hex()}&dn=%ff", "dn"),
        (f"magnet:?xs=urn:btpk:{KEY.hex()}&dn=a&dn=b", "dn: given twice"),
        (f"magnet:?xs=urn:btpk:{KEY.hex()}&x.pe=host", "x.pe:"),
        (f"magnet:?xs=urn:btpk:{KEY.hex()}&x.pe=host:0", "x.pe: port"),
        (f"magnet:?xs=urn:btpk:{KEY.hex()}&x.pe=host:99999", "x.pe: port"),
        (f"magnet:?xs=urn:btpk:{KEY.hex()}&x.pe=ho_st:1", "x.pe:"),
        (f"magnet:?xs=urn:btpk:{KEY.hex()}&x.pe=::1:5", "x.pe:"),
        (f"magnet:?xs=urn:btpk:{KEY.hex()}" + "&x.pe=h:1" * 17, "x.pe: more than"),
        (f"magnet:?xs=urn:btpk:{KEY.hex()}&novalue", "has no '=value'"),
        ("magnet:?" + "a" * 5000, "longer than"),
        (f"magnet:?xs=urn:btpk:{KEY.hex()}&x.op=abcd", "x.op:"),
        (f"magnet:?xs=urn:btpk:{KEY.hex()}&x.op=zz", "x.op:"),
    ],
)
def test_bad_uris_name_the_part(text, part):
    with pytest.raises(URIError, match=part.replace("[", r"\[").replace("?", r"\?")):
        uri.parse(text)


def test_uri_error_is_a_config_error():
    """The CLI maps ConfigError to exit 2 (usage), so a bad URI is a usage error."""
    assert issubclass(URIError, ConfigError)


def test_bad_uri_on_the_command_line_exits_2(home):
    from tests.conftest import run_swarm

    res = run_swarm("status", "magnet:?xs=urn:btpk:00", "--data-dir", str(home), timeout=60)
    assert res.returncode == 2
    assert "xs:" in res.stderr


def test_a_port_of_non_ascii_digits_is_a_uri_error():
    """Hypothesis found '¹' (superscript one): str.isdigit() takes it, int() does not, and the
    parser raised a bare ValueError instead of naming the part."""
    with pytest.raises(URIError, match="is not a number"):
        uri.parse("magnet:?xs=urn:btpk:" + "ab" * 32 + "&x.pe=1.2.3.4:%C2%B92")
