"""Browser tabs without a browser: signed signaling, the node's validation of a tab,
tab member records, tab-signed DHT entries and the relay's refusal (issue 16)."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import numpy as np
import pytest

from dht.announce import Announcement, announcement_buffer
from dht.errors import ItemError
from identity import PeerKey
from swarm.control.election import candidate
from swarm.errors import AuthenticationError, LinkClosed, ProtocolError
from swarm.links import tabs as relay
from swarm.links import tls
from swarm.members import MemberRecord, membership_topic
from swarm.runtime.protocol import TaskFailed, TaskResult
from swarm.web.session import (
    DOMAIN,
    check_validation,
    open_json,
    parse_join,
    seal_json,
    tab_record,
    validation_task,
)
from tests.dht_support import loopback_dht

SDP = "v=0\r\nm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\n"


def tab_message(key: PeerKey, body: dict) -> str:
    """What join.js sends: the JSON text and the tab's Ed25519 signature over it."""
    text = json.dumps(body)
    return json.dumps({"b": text, "s": base64.b64encode(key.sign(DOMAIN + text.encode()))
                       .decode()})


def test_signed_signaling_checks_signer_and_session():
    tab = PeerKey.generate()
    body = {"t": "join", "peer": tab.peer_id.hex(), "nonce": "n1", "offer": SDP,
            "tflops": 0.5, "backend": "webgpu"}
    got, signer = open_json(tab_message(tab, body), None, "n1")
    assert signer == tab.peer_id and parse_join(got, signer).tflops == 0.5
    with pytest.raises(AuthenticationError, match="another session"):
        open_json(tab_message(tab, body), None, "n2")
    forged = json.loads(tab_message(tab, body))
    forged["b"] = forged["b"].replace("0.5", "900")
    with pytest.raises(AuthenticationError, match="does not verify"):
        open_json(json.dumps(forged), None, "n1")
    other = PeerKey.generate()  # signed by one key, naming another
    with pytest.raises(AuthenticationError):
        open_json(tab_message(other, body), None, "n1")
    for junk in ("{", '{"b": 1, "s": "x"}', "x" * 40_000):
        with pytest.raises(ProtocolError):
            open_json(junk, None, "n1")
    node = PeerKey.generate()  # and the node's messages verify under its key
    sealed = json.loads(seal_json(node, {"t": "hello", "nonce": "n1"}))
    assert node.peer_id.public_key().verify(base64.b64decode(sealed["s"]),
                                            DOMAIN + sealed["b"].encode()) is None


@pytest.mark.parametrize("body", [
    {"t": "join", "offer": "no data channel", "tflops": 1, "backend": "webgpu"},
    {"t": "join", "offer": SDP, "tflops": float("nan"), "backend": "webgpu"},
    {"t": "join", "offer": SDP, "tflops": -1, "backend": "webgpu"},
    {"t": "join", "offer": SDP, "tflops": 1, "backend": "cuda"},
])
def test_bad_join_claims_are_refused(body):
    with pytest.raises(ProtocolError):
        parse_join(body, PeerKey.generate().peer_id)


def test_validation_accepts_only_the_exact_product():
    msg, want = validation_task(np.random.default_rng(1))
    a, b = (arg.array for arg in msg.args)
    assert np.array_equal(want, a @ b) and np.any(want)
    check_validation(TaskResult(1, [want.copy()], 0.1), want)
    cases = {"zeros": np.zeros_like(want), "NaN": np.where(want > 0, np.nan, want),
             "wrong in": want + (np.arange(want.size).reshape(want.shape) == 5)}
    for words, out in cases.items():
        with pytest.raises(AuthenticationError, match=words):
            check_validation(TaskResult(1, [out.astype(np.float32)], 0.1), want)
    with pytest.raises(AuthenticationError, match="shape"):
        check_validation(TaskResult(1, [want[:3]], 0.1), want)
    with pytest.raises(AuthenticationError, match="failed on the tab"):
        check_validation(TaskFailed(1, "error", "no GPU"), want)
    with pytest.raises(AuthenticationError):
        check_validation(TaskResult(2, [want], 0.1), want)  # another task's answer
    other, _ = validation_task(np.random.default_rng(2))  # fresh inputs every time
    assert not np.array_equal(other.args[0].array, a)


def test_tab_records_are_browser_workers_that_never_coordinate():
    tab, node = PeerKey.generate().peer_id, PeerKey.generate().peer_id
    rec = tab_record(tab, node, ("10.0.0.1", 4000), 9.0)
    back = MemberRecord.decode(rec.encode(), tab)
    assert back == rec and back.kind == "browser" and back.via == node
    assert not candidate(back, 1.0).eligible  # however fast it claims to be
    native = MemberRecord(node, 1.0)
    assert MemberRecord.decode(native.encode()).kind == "native"
    import msgpack

    m = msgpack.unpackb(rec.encode())
    for change in ({"k": "robot"}, {"via": b"short"}, {"via": None}):
        bad = dict(m, **change)
        if change.get("via", 1) is None:
            del bad["via"]
        with pytest.raises(ProtocolError):
            MemberRecord.decode(msgpack.packb(bad, use_bin_type=True))


async def test_a_node_publishes_only_entries_its_tab_signed():
    async with loopback_dht(3, rpc_timeout=1.0) as nodes:
        tab = PeerKey.generate()
        sid = bytes(20)
        topic = membership_topic(sid)
        record = tab_record(tab.peer_id, nodes[0].peer_id, ("127.0.0.1", 1), 0.1).encode()
        expires = time.time() + 60
        sig = tab.sign(announcement_buffer(topic, expires, record))
        await nodes[0].publish_announcement(topic, Announcement(tab.peer_id, record,
                                                                expires, sig))
        peers = await nodes[2].get_peers(topic)
        assert [p.peer_id for p in peers] == [tab.peer_id]
        forged = Announcement(tab.peer_id, record, expires + 1, sig)  # longer life
        with pytest.raises(ItemError):
            await nodes[0].publish_announcement(topic, forged)
        late = time.time() + 3 * 3600
        with pytest.raises(ValueError):
            await nodes[0].publish_announcement(topic, Announcement(
                tab.peer_id, record, late, tab.sign(announcement_buffer(topic, late, record))))


async def test_relay_dial_refused_for_a_tab_it_does_not_serve():
    node, requester = PeerKey.generate(), PeerKey.generate()

    async def serve(link):
        assert isinstance(await link.recv(), relay.RelayOpen)
        await link.send(relay.RelayOpened(False, "no such tab here"))

    server = await tls.listen(node, "127.0.0.1", 0, on_link=serve)
    try:
        with pytest.raises(LinkClosed, match="no such tab"):
            await relay.dial(requester, "127.0.0.1", server.port, node.peer_id,
                             PeerKey.generate().peer_id)
        with pytest.raises(AuthenticationError):  # a relay with another key than named
            await asyncio.wait_for(relay.dial(requester, "127.0.0.1", server.port,
                                              PeerKey.generate().peer_id,
                                              PeerKey.generate().peer_id), 10)
    finally:
        await server.close()


class _StubNode:
    """Just what the web server uses of a node (no DHT traffic in these tests)."""

    def __init__(self) -> None:
        from types import SimpleNamespace

        self.key = PeerKey.generate()
        self.peer_id = self.key.peer_id
        self.config = SimpleNamespace(host="127.0.0.1")
        self.host = None
        self.published: list = []
        self.dht = SimpleNamespace(publish_announcement=self._publish)
        self.blocked: set = set()

    async def _publish(self, topic, ann) -> None:
        self.published.append(ann)

    def _accepts(self, peer) -> bool:
        return peer not in self.blocked


@pytest.fixture
async def web():
    from swarm.web.server import SwarmInfo, WebServer

    node = _StubNode()
    server = WebServer(node, SwarmInfo(bytes(20), "lab", "ab" * 16, False, "magnet:?"),
                       "127.0.0.1", 0)
    await server.start()
    try:
        yield server, node
    finally:
        await server.stop()


async def test_the_signaling_socket_refuses_other_sites_and_unsigned_joins(web):
    import aiohttp

    server, node = web
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as err:
            await http.ws_connect(f"{server.url}ws", origin="http://evil.example")
        assert err.value.status == 403
        async with http.ws_connect(f"{server.url}ws",
                                   origin=server.url.rstrip("/")) as ws:
            hello = json.loads(await ws.receive_str(timeout=10))
            body = json.loads(hello["b"])
            assert node.peer_id.public_key().verify(
                base64.b64decode(hello["s"]), DOMAIN + hello["b"].encode()) is None
            tab, liar = PeerKey.generate(), PeerKey.generate()
            join = {"t": "join", "peer": tab.peer_id.hex(), "nonce": body["nonce"],
                    "offer": SDP, "tflops": 1.0, "backend": "cpu"}
            await ws.send_str(tab_message(liar, join))  # signed by a key it does not name
            refused = json.loads(json.loads(await ws.receive_str(timeout=10))["b"])
            assert refused["t"] == "refused" and "verify" in refused["reason"]
    assert server.tabs == {} and node.published == []


async def test_the_join_page_names_the_swarm_and_serves_the_kernel(web):
    import aiohttp

    server, node = web
    async with aiohttp.ClientSession() as http:
        async with http.get(server.url) as r:
            page = await r.text()
            assert r.status == 200 and "Content-Security-Policy" in r.headers
        for label in ("Always", "This time", "Not now"):
            assert f">{label}</button>" in page
        async with http.get(f"{server.url}config.json") as r:
            cfg = await r.json()
        assert cfg["server"] == node.peer_id.hex() and cfg["name"] == "lab"
        async with http.get(f"{server.url}kernel/matmul_tiled.wgsl") as r:
            from compute.kernels import source

            assert await r.text() == source("matmul_tiled")
        for bad in ("static/..%2fserver.py", "static/.hidden.js", "static/server.py"):
            async with http.get(f"{server.url}{bad}") as r:
                assert r.status == 404, bad


def test_http_option_parses_host_and_port():
    from swarm.errors import ConfigError
    from swarm.web.server import parse_http

    assert parse_http("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_http("[::1]:8080") == ("::1", 8080)
    for bad in ("8080", "host:", ":80", "h:99999", "h:x"):
        with pytest.raises(ConfigError, match="HOST:PORT"):
            parse_http(bad)


async def test_a_rebound_host_name_reaches_no_route(web):
    """Issue 34, DNS rebinding: a page served as evil.example whose name now resolves to the
    node sends matching Origin and Host headers; every route refuses its Host name (421),
    while the node's address and localhost are served."""
    import aiohttp

    server, _ = web
    evil = "evil.example"
    async with aiohttp.ClientSession() as http:
        for path in ("", "status.json", "config.json", "static/join.js"):
            async with http.get(f"{server.url}{path}", headers={"Host": evil}) as r:
                assert r.status == 421, path
        with pytest.raises(aiohttp.WSServerHandshakeError) as err:
            await http.ws_connect(f"{server.url}ws", origin=f"http://{evil}",
                                  headers={"Host": evil})
        assert err.value.status == 421
        for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}"):
            async with http.get(f"{server.url}status.json", headers={"Host": host}) as r:
                assert r.status == 200, host


def test_host_names_allowed_are_addresses_localhost_and_the_operators():
    from swarm.web.hosts import allowed_names, host_allowed

    names = allowed_names("node.lan", ["swarm.example.org"])
    for ok in ("127.0.0.1:8080", "[::1]:8080", "10.0.0.5", "localhost", "a.localhost:1",
               "NODE.lan:8080", "swarm.example.org.", "swarm.example.org:443"):
        assert host_allowed(ok, names), ok
    for bad in ("evil.example", "evil.example:8080", "localhost.evil.example", "", None,
                "127.0.0.1.evil.example"):
        assert not host_allowed(bad, names), bad
