"""Nodes on separate test hosts (network namespaces joined by a bridge) form a swarm: each
peer announces its own address, `swarm status` and `swarm submit` work from another host,
the job comes back verified and equal to numpy's."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.system import netns
from tests.system.netns import SUBNET, netem_unavailable
from tests.system.support import members, submit_matmul

pytestmark = [pytest.mark.system, pytest.mark.slow]


def _submit(cluster, host, tmp_path, *extra: str) -> dict:
    res = submit_matmul(host, cluster.uri, tmp_path, "--min-workers", "3", *extra)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout)


def test_hosts_form_a_swarm_and_verify_a_job(cluster, net, tmp_path):
    hosts = [net.host("a"), net.host("a"), net.host("b"), net.host("b")]
    cluster.publish(hosts[0])
    assert f"x.pe={hosts[0].addr}:" in cluster.uri
    workers = [cluster.join(f"w{i}", hosts[i]) for i in (1, 2)]
    peers = {w.peer for w in workers}
    st = cluster.wait_status(hosts[3], lambda s: len(s["members"]) == 3 and s["coordinator"],
                             90, "3 members and a coordinator")
    assert peers < members(st)
    addrs = {m["dht"][0] for m in st["members"]}
    assert addrs == {h.addr for h in hosts[:3]}, addrs  # one distinct address per host
    assert all(a.startswith(SUBNET + ".") for a in addrs)
    report = _submit(cluster, hosts[3], tmp_path)
    done = {r["peer"] for r in report["peers"] if r["verified"]}
    assert done and done <= members(st), report  # remote workers did the work, verified
    assert all(r["rejected"] == 0 for r in report["peers"])


def test_wan_emulated_with_netem(cluster, net, tmp_path):
    """40 ms RTT and 1% loss on every host link, where the kernel has netem."""
    why = netem_unavailable()
    if why:
        pytest.skip(f"{why}; the project's own SWARM_CHAOS=delay=MS faults stand in "
                    "(tests/system/test_faults.py runs a delayed worker)")
    hosts = [net.host("a"), net.host("a"), net.host("b"), net.host("b")]
    for h in hosts:
        subprocess.run(h.wrap(["tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay",
                               "20ms", "loss", "1%"]), check=True, timeout=20)
    cluster.publish(hosts[0])
    workers = {cluster.join(f"w{i}", hosts[i]).peer for i in (1, 2)}
    st = cluster.wait_status(hosts[3], lambda s: len(s["members"]) == 3 and s["coordinator"],
                             120, "3 members")
    report = _submit(cluster, hosts[3], tmp_path)
    # the delay and loss were in effect the whole time, and remote workers did the work
    for h in hosts:
        shown = subprocess.run(h.wrap(["tc", "qdisc", "show", "dev", "eth0"]),
                               capture_output=True, text=True, check=True, timeout=20).stdout
        assert "netem" in shown and "delay 20ms" in shown and "loss 1%" in shown, shown
    done = {r["peer"] for r in report["peers"] if r["verified"]}
    assert done & workers and done <= members(st), report
    assert all(r["rejected"] == 0 for r in report["peers"])


def test_namespaces_a_killed_run_left_are_swept_and_live_ones_kept(net):
    """A killed run never deletes its namespaces; a later run whose pid repeats it could not
    make its own."""
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid names no process now
    stale, live = f"sw{dead.pid}x0", f"sw{os.getpid()}x999"
    for ns in (stale, live):
        subprocess.run(["ip", "netns", "add", ns], check=True, timeout=20)
    try:
        gone = netns.sweep()
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                timeout=20).stdout.split()
        assert stale in gone and stale not in listed
        assert live not in gone and live in listed
    finally:
        for ns in (stale, live):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
