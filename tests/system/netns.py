"""Test hosts made of Linux network namespaces: each host is a namespace with one veth
link to a bridge in a "switch" namespace; hosts sit on side "a" or side "b", the two
bridges joined by one veth pair, so :meth:`Net.partition` splits the network in two and
:meth:`Net.heal` joins it again. Every name carries the test process's pid and a counter,
addresses come from 10.213.0.0/24 and exist only inside these namespaces; :meth:`Net.close`
deletes every namespace (and with it every link) it made."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

from tests.conftest import no_install_fixes

SUBNET = "10.213.0"
"""The /24 every test host's address comes from (private, only inside our namespaces)."""

_runs = itertools.count()


def _ip(*args: str) -> None:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if res.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {res.stderr.strip()}")


class NetnsError(RuntimeError):
    """An ``ip`` command failed."""


def sweep() -> list[str]:
    """Delete the namespaces that killed test runs left behind (named for a pid that is no
    longer alive): a later run whose pid repeats one could not make its own. Returns them."""
    res = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=20)
    gone = []
    for name in (line.split(maxsplit=1)[0] for line in res.stdout.splitlines() if line.strip()):
        m = re.fullmatch(r"swt?(\d+)(x\d+\w*|bep42|probe)", name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            try:
                _ip("netns", "del", name)
                gone.append(name)
            except NetnsError:
                pass
    return gone


def unavailable() -> str | None:
    """Why namespaces cannot be used here, or None when they can (leftovers swept first)."""
    if os.geteuid() != 0:
        return "network namespaces need root (run the system tests as root)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    sweep()
    probe = f"swt{os.getpid()}probe"
    try:
        _ip("netns", "add", probe)
    except (NetnsError, OSError) as exc:
        return f"`ip netns add` fails here: {exc}"
    try:
        _ip("netns", "del", probe)
    except NetnsError:
        pass
    return None


def netem_unavailable() -> str | None:
    """Why ``tc netem`` cannot emulate a WAN here, or None when it can."""
    if shutil.which("tc") is None:
        return "tc is not installed"
    net = Net()
    try:
        h = net.host("a")
        res = subprocess.run(["ip", "netns", "exec", h.ns, "tc", "qdisc", "add", "dev", "eth0",
                              "root", "netem", "delay", "20ms"], capture_output=True, text=True,
                             timeout=20)
        if res.returncode != 0:
            return no_install_fixes(
                f"tc netem is not supported by this kernel: {res.stderr.strip()}")
        return None
    finally:
        net.close()


@dataclass
class NsHost:
    """A test host: a namespace with one address."""

    ns: str
    """Namespace name."""
    addr: str
    """Its IPv4 address."""

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this host (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.ns, *argv]


@dataclass
class Host(NsHost):
    """One test host on one side of the switch."""

    side: str
    """"a" or "b"."""
    port: str
    """The switch-side end of its veth (brought down to cut this host off)."""


@dataclass
class Net:
    """Namespaces of one test; :meth:`close` deletes them all."""

    tag: str = field(default_factory=lambda: f"sw{os.getpid()}x{next(_runs)}")
    """Unique prefix of every name (pid + counter)."""
    hosts: list[Host] = field(default_factory=list)
    """Hosts made so far."""
    _spaces: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.switch = self._ns("s")
        for br in ("br0", "br1"):
            _ip("-n", self.switch, "link", "add", br, "type", "bridge")
            _ip("-n", self.switch, "link", "set", br, "up")
        _ip("-n", self.switch, "link", "add", "ab0", "type", "veth", "peer", "name", "ab1")
        _ip("-n", self.switch, "link", "set", "ab0", "master", "br0")
        _ip("-n", self.switch, "link", "set", "ab1", "master", "br1")
        self.heal()

    def _ns(self, suffix: str) -> str:
        name = f"{self.tag}{suffix}"
        _ip("netns", "add", name)
        self._spaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")
        return name

    def host(self, side: str = "a") -> Host:
        """A new host on ``side`` ("a" or "b")."""
        i = len(self.hosts) + 1
        ns = self._ns(f"h{i}")
        port = f"p{i}"
        _ip("link", "add", port, "netns", self.switch, "type", "veth", "peer", "name", "eth0",
            "netns", ns)
        _ip("-n", self.switch, "link", "set", port, "master", "br0" if side == "a" else "br1")
        _ip("-n", self.switch, "link", "set", port, "up")
        addr = f"{SUBNET}.{i}"
        _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        h = Host(ns, addr, side, port)
        self.hosts.append(h)
        return h

    def partition(self) -> None:
        """Cut side a off from side b."""
        _ip("-n", self.switch, "link", "set", "ab0", "down")

    def heal(self) -> None:
        """Join the two sides again."""
        _ip("-n", self.switch, "link", "set", "ab0", "up")
        _ip("-n", self.switch, "link", "set", "ab1", "up")

    def __enter__(self) -> Net:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Delete every namespace made (their links go with them)."""
        errors = []
        for ns in reversed(self._spaces):
            try:
                _ip("netns", "del", ns)
            except NetnsError as exc:
                errors.append(str(exc))
        self._spaces.clear()
        if errors:
            raise NetnsError("; ".join(errors))
