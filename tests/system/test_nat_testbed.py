"""The NAT testbed itself behaves like the NATs it stands for: the cone router keeps a LAN
host's port for every destination, the symmetric one maps each destination to another port,
nobody outside reaches a LAN unasked, flushing conntrack forgets mappings, and coturn on the
public segment answers STUN and TURN with the generated credentials."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import subprocess_env
from tests.system.nat import PUBLIC

pytestmark = [pytest.mark.system]


def _reflector(host):
    p = subprocess.Popen(host.wrap([sys.executable, "-m", "tests.system.udp_probe", "reflect",
                                    "4000", "4001"]), stdout=subprocess.PIPE, text=True,
                         env=subprocess_env())
    assert p.stdout.readline().strip() == "ready"
    return p


def _probe(host, target, *ports: int) -> list[str]:
    res = subprocess.run(host.wrap([sys.executable, "-m", "tests.system.udp_probe", "probe",
                                    target, *map(str, ports)]),
                         capture_output=True, text=True, timeout=60, env=subprocess_env())
    assert res.returncode == 0, res.stderr
    return res.stdout.split("\n")[:-1]


def test_cone_keeps_ports_symmetric_does_not(natnet):
    server = natnet.public_host()
    cone, sym = natnet.router("cone"), natnet.router("symmetric", symmetric=True)
    a, b = natnet.behind(cone), natnet.behind(sym)
    refl = _reflector(server)
    try:
        local, seen1, seen2 = _probe(a, server.addr, 4000, 4001)
        port = local.split()[1]
        assert seen1 == seen2 == f"{cone.wan}:{port}"  # endpoint-independent mapping
        local, seen1, seen2 = _probe(b, server.addr, 4000, 4001)
        assert seen1.split(":")[0] == seen2.split(":")[0] == sym.wan
        assert seen1 != seen2  # a fresh port per destination
    finally:
        refl.kill()
        refl.wait(10)
    # nothing reaches a LAN host unasked, even with a route to the LAN through its router
    subprocess.run(server.wrap(["ip", "route", "add", f"{cone.lan}.0/24", "via", cone.wan]),
                   check=True, timeout=20)
    inside = _reflector(a)
    try:
        assert _probe(server, a.addr, 4000)[1:] == ["timeout"]
    finally:
        inside.kill()
        inside.wait(10)


def test_flush_forgets_mappings(natnet):
    server = natnet.public_host()
    sym = natnet.router("symmetric", symmetric=True)
    b = natnet.behind(sym)
    refl = _reflector(server)
    try:
        assert _probe(b, server.addr, 4000)[1] != "timeout"
    finally:
        refl.kill()
        refl.wait(10)
    listed = subprocess.run(["ip", "netns", "exec", sym.ns, "conntrack", "-L"],
                            capture_output=True, text=True, timeout=20).stdout
    assert b.addr in listed
    sym.flush()
    listed = subprocess.run(["ip", "netns", "exec", sym.ns, "conntrack", "-L"],
                            capture_output=True, text=True, timeout=20).stdout
    assert b.addr not in listed


def test_turn_server_allocates_with_generated_credentials(natnet):
    turn = natnet.start_turn()
    host = natnet.behind(natnet.router("symmetric", symmetric=True))
    script = (
        "import asyncio, aioice.turn as t\n"
        "class P(asyncio.DatagramProtocol): pass\n"
        "async def main():\n"
        f"    tr, _ = await t.create_turn_endpoint(P, ('{PUBLIC}.1', 3478), "
        f"'{turn.username}', '{turn.credential}')\n"
        "    print(tr.get_extra_info('sockname')[0], tr.get_extra_info('related_address')[0])\n"
        "    tr.close(); await asyncio.sleep(0.2)\n"
        "asyncio.run(asyncio.wait_for(main(), 20))\n")
    res = subprocess.run(host.wrap([sys.executable, "-c", script]), capture_output=True,
                         text=True, timeout=60, env=subprocess_env())
    assert res.returncode == 0, res.stderr[-2000:] + turn.log_text()[-2000:]
    relayed, mapped = res.stdout.split()
    assert relayed == f"{PUBLIC}.1"
    assert mapped == natnet.routers[0].wan
