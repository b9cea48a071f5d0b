"""`swarm doctor`: its checks as plain functions, a run on this machine, and the NAT check
against STUN responders on 127.0.0.1 that the test runs itself (never a public server)."""

from __future__ import annotations

import json
import socket
import threading

import pytest
from aioice import stun

from swarm import cli
from swarm.commands import doctor
from tests.conftest import run_swarm


class StunResponder:
    """A STUN binding responder on 127.0.0.1 in a thread; ``shift`` adds to the mapped port
    (a symmetric NAT maps each destination to another port); ``silent`` never answers."""

    def __init__(self, shift: int = 0, silent: bool = False) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.addr = self.sock.getsockname()
        self.shift, self.silent = shift, silent
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                data, (host, port) = self.sock.recvfrom(2048)
            except TimeoutError:
                continue
            msg = stun.parse_message(data)
            if self.silent or msg.message_method != stun.Method.BINDING:
                continue
            reply = stun.Message(stun.Method.BINDING, stun.Class.RESPONSE, msg.transaction_id,
                                 {"XOR-MAPPED-ADDRESS": (host, port + self.shift)})
            self.sock.sendto(bytes(reply), (host, port))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def responders():
    made: list[StunResponder] = []

    def make(**kw) -> StunResponder:
        made.append(StunResponder(**kw))
        return made[-1]

    yield make
    for r in made:
        r.close()


def _hp(addr: tuple[str, int]) -> str:
    return f"{addr[0]}:{addr[1]}"


def _doctor(capsys, tmp_path, *extra: str) -> tuple[int, dict]:
    code = cli.main(["doctor", "--no-bench", "--json", "--data-dir", str(tmp_path), *extra])
    return code, json.loads(capsys.readouterr().out)


def _by_check(report: dict) -> dict[str, dict]:
    return {f["check"]: f for f in report["findings"]}


def test_doctor_on_this_machine(tmp_path):
    """The real checks here: backends validated with GFLOPS, the key and permission checks,
    each finding with what to do; a world-readable key file is a failure (exit 4)."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "peer.key").write_bytes(b"x" * 32)
    (home / "peer.key").chmod(0o644)
    res = run_swarm("doctor", "--json", "--data-dir", str(home), timeout=120)
    report = json.loads(res.stdout)
    assert res.returncode == cli.EXIT_UNAVAILABLE and report["ok"] is False, res.stderr
    for f in report["findings"]:
        assert set(f) == {"check", "status", "detail", "fix"}
        assert f["status"] in ("ok", "info", "warn", "fail")
        assert f["status"] == "ok" or f["fix"], f  # every problem says what to do
    found = _by_check(report)
    assert found["backend numpy"]["status"] == "ok" and "GFLOPS" in found["backend numpy"]["detail"]
    assert "backend wgpu" in found
    assert found["security key"]["status"] in ("ok", "warn")
    assert found["key file"]["status"] == "fail"
    assert found["key file"]["fix"] == f"chmod 600 {home / 'peer.key'}"
    (home / "peer.key").chmod(0o600)
    res = run_swarm("doctor", "--no-bench", "--data-dir", str(home), timeout=60)
    assert res.returncode == 0 and "key files" in res.stdout  # the table


def test_doctor_sees_no_nat_on_loopback(responders, capsys, tmp_path):
    a, b = responders(), responders()
    code, report = _doctor(capsys, tmp_path, "--stun", _hp(a.addr),
                           "--stun", "stun:" + _hp(b.addr))
    assert code == 0
    nat = _by_check(report)["nat"]
    assert nat["status"] == "ok" and nat["detail"].startswith("no NAT")


def test_doctor_tells_a_symmetric_nat(responders, capsys, tmp_path):
    a, b = responders(), responders(shift=7)  # b sees another port: endpoint-dependent
    code, report = _doctor(capsys, tmp_path, "--stun", _hp(a.addr),
                           "--stun", _hp(b.addr))
    nat = _by_check(report)["nat"]
    assert code == 0 and nat["status"] == "warn" and "symmetric NAT" in nat["detail"]
    assert "TURN" in nat["fix"]


def test_doctor_says_when_udp_gets_no_answer(responders, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(doctor, "STUN_TIMEOUT", 1.0)
    quiet = responders(silent=True)
    code, report = _doctor(capsys, tmp_path, "--stun", _hp(quiet.addr))
    udp = _by_check(report)["udp"]
    assert code == cli.EXIT_UNAVAILABLE and udp["status"] == "fail" and "UDP" in udp["fix"]


def test_doctor_ignores_garbage_from_the_stun_port(capsys, tmp_path, monkeypatch):
    """A datagram that is not STUN is dropped (no crash); the check just gets no answer."""
    monkeypatch.setattr(doctor, "STUN_TIMEOUT", 1.0)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5)
    stop = threading.Event()

    def garble() -> None:
        while not stop.is_set():
            try:
                _, addr = sock.recvfrom(2048)
            except OSError:
                return
            sock.sendto(b"\x01\x01\x00\x08" + b"\x00" * 30, addr)

    t = threading.Thread(target=garble, daemon=True)
    t.start()
    try:
        code, report = _doctor(capsys, tmp_path, "--stun", _hp(sock.getsockname()))
    finally:
        stop.set()
        sock.close()
        t.join(5)
    assert _by_check(report)["udp"]["status"] == "fail"


def test_nat_findings_from_mappings():
    srv1, srv2 = ("198.51.100.1", 3478), ("198.51.100.2", 3478)
    cone = doctor.nat_finding(40000, [(srv1, "10.0.0.2", ("203.0.113.9", 61000)),
                                      (srv2, "10.0.0.2", ("203.0.113.9", 61000))])
    assert cone.status == "ok" and cone.detail.startswith("cone NAT")
    one = doctor.nat_finding(40000, [(srv1, "10.0.0.2", ("203.0.113.9", 61000)),
                                     (srv2, "10.0.0.2", None)])
    assert one.status == "info" and "two STUN servers" in one.fix and "no answer" in one.detail


def test_clock_findings():
    now = 1_000_000.0
    period = doctor.announce_period()
    fresh = [now - 1, now - 20, now - period + 10]  # honest members, announced recently
    assert doctor.clock_finding(fresh, now).status == "ok"
    ahead = [t + 60 for t in fresh]  # their clocks a minute ahead: ours is behind
    late = doctor.clock_finding(ahead, now)
    assert late.status == "warn" and "NTP" in late.fix
    assert doctor.clock_finding([t + 600 for t in fresh], now).status == "fail"
    assert doctor.clock_finding([t - 600 for t in fresh], now).status == "fail"
    assert doctor.clock_finding([], now).status == "info"


def test_permission_and_backend_findings(tmp_path):
    found = doctor.permission_findings(tmp_path, [], 0o755)
    assert found[0].status == "warn" and found[0].fix == f"chmod 700 {tmp_path}"
    none = doctor.backend_findings({"backends": [
        {"name": "numpy", "validated": False, "reason": "wrong products", "gflops": {}}]})
    assert [f.status for f in none] == ["warn", "fail"]


def test_doctor_with_an_unreachable_swarm_still_reports(capsys, tmp_path):
    """A URI whose bootstrap peer is silent is one finding, not a failed doctor run."""
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    try:
        uri = (f"magnet:?xs=urn:btpk:{'11' * 32}&dn=lab&x.op={'22' * 16}&x.pe=127.0.0.1:"
               f"{silent.getsockname()[1]}")
        code, report = _doctor(capsys, tmp_path, uri)
    finally:
        silent.close()
    found = _by_check(report)
    assert code == 0 and found["swarm"]["status"] == "warn" and "x.pe" in found["swarm"]["fix"]
    assert "data dir" in found
