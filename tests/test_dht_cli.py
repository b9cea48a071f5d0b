"""`swarm dht serve` as real processes: prints its address, serves items, stops on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal

import pytest

from dht import DHTNode, ItemError
from identity import PeerKey
from swarm.commands.dht import parse_addr
from swarm.errors import ConfigError
from tests.conftest import run_swarm, subprocess_env, swarm_cmd
from tests.dht_support import loopback_dht

pytestmark = [pytest.mark.system, pytest.mark.timeout(120)]


async def _start(home, *extra):
    proc = await asyncio.create_subprocess_exec(
        *swarm_cmd("dht", "serve", "--port", "0", *extra, "--data-dir", str(home)),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=subprocess_env())
    line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
    assert line.startswith("listening on 127.0.0.1:"), line
    return proc, parse_addr(line.split()[-1])


async def _terminate(proc) -> int:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    return await asyncio.wait_for(proc.wait(), 30)


async def test_serve_stores_items_and_stops_on_sigterm(tmp_path):
    procs = []
    # Two server processes on a busy 2-core host: no hurry. A fixed slow_after (grace 4 s)
    # rather than the adaptive one (from 50 ms): under load a lookup gave up on a server
    # that was slow, not gone, wrote the item to the other only and the reader missed it.
    client = DHTNode(rpc_timeout=5, slow_after=1.0)
    try:
        first, addr1 = await _start(tmp_path / "a")
        procs.append(first)
        second, addr2 = await _start(tmp_path / "b", "--bootstrap", f"127.0.0.1:{addr1[1]}")
        procs.append(second)
        await client.listen()
        assert await client.bootstrap([addr2]) >= 1
        key = PeerKey.generate()
        await client.put_mutable(key, b"kept by the servers")
        reader = DHTNode(rpc_timeout=5, slow_after=1.0)
        await reader.listen()
        try:
            # through both servers, as a client given both would: the put returns once one
            # server took the item and a grace passed, the other's write may still be on its
            # way, and a reader knowing only the server still waiting missed the item (CI9
            # and CI11, 2 of 3 runs with three pytest workers; the routing cause not pinned)
            assert await reader.bootstrap([addr1, addr2]) >= 1
            assert (await reader.get_mutable(key.public_bytes)).value == b"kept by the servers"
        finally:
            await reader.stop()
        for proc in procs:
            assert await _terminate(proc) == 0
        state = json.loads((tmp_path / "a" / "dht" / "node.json").read_text())
        assert len(bytes.fromhex(state["node_id"])) == 20
        assert [h for h, _ in state["neighbours"]] and (tmp_path / "a" / "dht" / "items.sqlite3").exists()
    finally:
        await client.stop()
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


def test_bad_bootstrap_address_is_a_usage_error(tmp_path):
    res = run_swarm("dht", "serve", "--bootstrap", "nowhere", "--data-dir", str(tmp_path))
    assert res.returncode == 2 and "HOST:PORT" in res.stderr
    with pytest.raises(ConfigError):
        parse_addr("host:99999")
    assert parse_addr("[::1]:6881") == ("::1", 6881)


async def test_serve_nodes_refuse_forged_charters(tmp_path):
    """A bare `swarm dht serve` node runs the swarm validators: a charter without a valid
    owner proof is refused on store, so no reader can get it from the network."""
    from identity import Charter, Policy, Signed
    from swarm.control import charter
    from tests.identity_support import owner_key

    proc, addr = await _start(tmp_path / "serve")
    attacker = DHTNode(rpc_timeout=2)  # runs no validators itself
    try:
        await attacker.listen()
        assert await attacker.bootstrap([addr]) >= 1
        swarm_key = PeerKey.generate()
        owner = owner_key(tmp_path, "owner")
        stmt = Charter(swarm=swarm_key.public_bytes, counter=1, name="lab",
                       owners=(owner.credential,), policy=Policy(), admins=())
        with pytest.raises(ItemError, match="charter refused"):
            await charter.publish(attacker, swarm_key, Signed(stmt, ()))  # no owner proof
        await attacker.stop()  # from now on only the serve node can answer
        reader = DHTNode(rpc_timeout=2)  # no validators either: it trusts what it gets
        await reader.listen()
        try:
            await reader.bootstrap([addr])
            assert await reader.get_mutable(swarm_key.public_bytes, charter.CHARTER_SALT) is None
        finally:
            await reader.stop()
    finally:
        await attacker.stop()
        assert await _terminate(proc) == 0


async def _swarm(*args: str) -> tuple[int, str, str]:
    """`swarm ARGS` as a child process while this loop keeps serving DHT nodes."""
    proc = await asyncio.create_subprocess_exec(
        *swarm_cmd(*args), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL, env=subprocess_env())
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


async def test_get_and_put_verbs(tmp_path):
    async with loopback_dht(3, rpc_timeout=2) as nodes:
        boot = ["--bootstrap", f"127.0.0.1:{nodes[0].address[1]}", "--json"]
        rc, out, err = await _swarm("dht", "put", "--value", '{"name": "lab", "n": [1, 2]}',
                                    *boot)
        assert rc == 0, err
        put = json.loads(out)
        assert put["seq"] is None and put["value"] == {"name": "lab", "n": [1, 2]}
        rc, out, err = await _swarm("dht", "get", "--target", put["target"], *boot)
        assert rc == 0 and json.loads(out) == put, err

        seed = tmp_path / "seed.hex"
        seed.write_text("11" * 32)
        mutable = ["dht", "put", "--key-file", str(seed), "--salt", "state", *boot]
        rc, out, err = await _swarm(*mutable, "--value", '"v1"')
        assert rc == 0 and json.loads(out)["seq"] == 1, err
        rc, out, err = await _swarm(*mutable, "--value", '"v2"', "--cas", "1")
        assert rc == 0 and json.loads(out)["seq"] == 2, err
        rc, out, err = await _swarm(*mutable, "--value", '"v3"', "--cas", "1")
        assert rc == 1 and "301" in err
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        pub = Ed25519PrivateKey.from_private_bytes(b"\x11" * 32).public_key().public_bytes_raw()
        rc, out, err = await _swarm("dht", "get", "--key", pub.hex(), "--salt", "state", *boot)
        assert rc == 0 and (json.loads(out)["seq"], json.loads(out)["value"]) == (2, "v2")
        rc, out, err = await _swarm("dht", "get", "--key", pub.hex(), "--salt", "other", *boot)
        assert rc == 1 and "no item" in err
        for bad in (["put", "--value", "1.5"], ["put", "--value", "{"],
                    ["get", "--key", "abcd"], ["put", "--value", "1", "--salt", "x"],
                    ["get", "--target", "00" * 20, "--bootstrap", "nowhere"]):
            rc, _, err = await _swarm("dht", *bad, *boot)
            assert rc == 2, (bad, err)
