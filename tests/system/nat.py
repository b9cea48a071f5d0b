"""A NAT testbed made of network namespaces: a "public" segment (a bridge) and private LANs,
each behind its own router namespace that masquerades with iptables, plus a STUN/TURN server
(coturn) on the public segment.

::

    public hosts --+                      +-- router "cone" (MASQUERADE) -- LAN 10.216.1.0/24
                   |-- bridge 10.215.0.0/24 --|
    coturn .1 -----+                      +-- router "symmetric" (MASQUERADE --random-fully)
                                                                        -- LAN 10.216.2.0/24

MASQUERADE keeps a LAN host's source port where it can (an endpoint-independent mapping,
filtered per remote address and port by conntrack); ``--random-fully`` picks a fresh port per
destination, a symmetric NAT, which no hole punching gets through: only TURN or a relay does.

Every name carries the test process's pid and a counter; every address exists only inside
these namespaces; :meth:`NatNet.close` stops coturn and deletes every namespace it made. What
the testbed needs from the system is listed by :func:`unavailable`; under CI a missing piece
fails the test instead of skipping it (tests/conftest.py).
"""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.system.netns import NsHost

PUBLIC = "10.215.0"
"""The public segment's /24 (the bridge is .1 and also the STUN/TURN address)."""
LAN = "10.216"
"""LAN n is 10.216.n.0/24; its router is .1, hosts from .2."""
TURN_PORT = 3478
TOOLS = {"ip": "iproute2", "iptables": "iptables", "turnserver": "coturn",
         "conntrack": "conntrack"}
"""Command -> Debian package the NAT tests need."""

_runs = itertools.count()


class NetnsError(RuntimeError):
    """A command that builds the testbed failed."""


def _run(*argv: str, ns: str | None = None) -> str:
    cmd = ["ip", "netns", "exec", ns, *argv] if ns else list(argv)
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    if res.returncode != 0:
        raise NetnsError(f"{' '.join(cmd)}: {res.stderr.strip()}")
    return res.stdout


def missing() -> list[str]:
    """Debian packages whose commands are not installed."""
    return sorted({pkg for cmd, pkg in TOOLS.items() if shutil.which(cmd) is None})


def unavailable() -> str | None:
    """Why the NAT testbed cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "the NAT testbed needs root (network namespaces, iptables)"
    if gone := missing():
        return (f"the NAT testbed needs {', '.join(gone)}: "
                f"apt-get install -y {' '.join(gone)} (make test installs them as root)")
    return None


@dataclass
class Host(NsHost):
    """One machine: public, or behind a router."""

    where: str
    """"public" or the name of the router it sits behind."""


@dataclass
class Router:
    """A NAT router: WAN on the public segment, one LAN behind it."""

    name: str
    """"cone" or "symmetric" (or any label), for messages."""
    ns: str
    """Namespace name."""
    wan: str
    """Its address on the public segment (the NAT's external address)."""
    lan: str
    """The LAN prefix ("10.216.N"); the router is .1 on it."""
    symmetric: bool
    """Whether it maps each destination to a fresh port (``--random-fully``)."""
    hosts: list[Host] = field(default_factory=list)

    def flush(self) -> None:
        """Forget every NAT mapping (a router reboot, a mapping timing out)."""
        subprocess.run(["ip", "netns", "exec", self.ns, "conntrack", "-F"],
                       capture_output=True, timeout=20, check=False)


@dataclass
class Turn:
    """A running coturn on the public segment."""

    url: str
    """"turn:ADDR:PORT"."""
    username: str
    credential: str
    proc: subprocess.Popen[str]
    log: Path

    @property
    def stun_url(self) -> str:
        return self.url.replace("turn:", "stun:", 1)

    def ice_servers(self) -> list[dict[str, object]]:
        """RTCIceServer objects (the ``SWARM_ICE_SERVERS`` form) for this server."""
        return [{"urls": [self.url], "username": self.username, "credential": self.credential}]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class NatNet:
    """Namespaces of one test; :meth:`close` deletes them all."""

    tmp: Path
    """Where coturn's config and log go."""
    tag: str = field(default_factory=lambda: f"nt{os.getpid()}x{next(_runs)}")
    """Unique prefix of every name (pid + counter)."""
    public: list[Host] = field(default_factory=list)
    routers: list[Router] = field(default_factory=list)
    turn: Turn | None = None
    _spaces: list[str] = field(default_factory=list)
    _next_public: int = 2

    def __post_init__(self) -> None:
        try:
            self.switch = self._ns("pub")
            _run("ip", "link", "add", "br0", "type", "bridge", ns=self.switch)
            _run("ip", "addr", "add", f"{PUBLIC}.1/24", "dev", "br0", ns=self.switch)
            _run("ip", "link", "set", "br0", "up", ns=self.switch)
        except BaseException:
            self.close()
            raise

    def _ns(self, suffix: str) -> str:
        name = f"{self.tag}{suffix}"
        _run("ip", "netns", "add", name)
        self._spaces.append(name)
        _run("ip", "link", "set", "lo", "up", ns=name)
        return name

    def _plug(self, ns: str, ifname: str) -> str:
        """A veth from ``ns`` (named ``ifname``) onto the public bridge; its address."""
        addr = f"{PUBLIC}.{self._next_public}"
        port = f"pp{self._next_public}"
        self._next_public += 1
        _run("ip", "link", "add", port, "netns", self.switch, "type", "veth", "peer", "name",
             ifname, "netns", ns)
        _run("ip", "link", "set", port, "master", "br0", ns=self.switch)
        _run("ip", "link", "set", port, "up", ns=self.switch)
        _run("ip", "addr", "add", f"{addr}/24", "dev", ifname, ns=ns)
        _run("ip", "link", "set", ifname, "up", ns=ns)
        return addr

    def public_host(self) -> Host:
        """A host with an address on the public segment (reachable by everyone)."""
        ns = self._ns(f"p{self._next_public}")
        h = Host(ns, self._plug(ns, "eth0"), "public")
        self.public.append(h)
        return h

    def router(self, name: str, symmetric: bool = False) -> Router:
        """A NAT router with an empty LAN behind it."""
        n = len(self.routers) + 1
        ns = self._ns(f"r{n}")
        wan = self._plug(ns, "wan")
        lan = f"{LAN}.{n}"
        _run("ip", "link", "add", "br1", "type", "bridge", ns=ns)
        _run("ip", "addr", "add", f"{lan}.1/24", "dev", "br1", ns=ns)
        _run("ip", "link", "set", "br1", "up", ns=ns)
        _run("sysctl", "-qw", "net.ipv4.ip_forward=1", ns=ns)
        rule = ["iptables", "-t", "nat", "-A", "POSTROUTING", "-s", f"{lan}.0/24", "-o", "wan",
                "-j", "MASQUERADE"]
        _run(*rule, *(["--random-fully"] if symmetric else []), ns=ns)
        # nothing from outside reaches the LAN unless conntrack has a mapping for it
        _run("iptables", "-A", "FORWARD", "-i", "wan", "-m", "conntrack", "!", "--ctstate",
             "ESTABLISHED,RELATED", "-j", "DROP", ns=ns)
        r = Router(name, ns, wan, lan, symmetric)
        self.routers.append(r)
        return r

    def behind(self, router: Router) -> Host:
        """A host on ``router``'s LAN, its default route through the router."""
        i = len(router.hosts) + 2
        ns = self._ns(f"r{self.routers.index(router) + 1}h{i}")
        addr = f"{router.lan}.{i}"
        port = f"lp{i}"
        _run("ip", "link", "add", port, "netns", router.ns, "type", "veth", "peer", "name",
             "eth0", "netns", ns)
        _run("ip", "link", "set", port, "master", "br1", ns=router.ns)
        _run("ip", "link", "set", port, "up", ns=router.ns)
        _run("ip", "addr", "add", f"{addr}/24", "dev", "eth0", ns=ns)
        _run("ip", "link", "set", "eth0", "up", ns=ns)
        _run("ip", "route", "add", "default", "via", f"{router.lan}.1", ns=ns)
        h = Host(ns, addr, router.name)
        router.hosts.append(h)
        return h

    def start_turn(self, timeout: float = 20.0) -> Turn:
        """coturn on the public bridge address, long-term credentials made up here."""
        user, password = "u" + secrets.token_hex(4), secrets.token_hex(12)
        conf = self.tmp / f"{self.tag}-turnserver.conf"
        log = self.tmp / f"{self.tag}-turnserver.log"
        addr = f"{PUBLIC}.1"
        conf.write_text("\n".join([
            f"listening-ip={addr}", f"relay-ip={addr}", f"listening-port={TURN_PORT}",
            f"user={user}:{password}", "realm=swarm.test", "lt-cred-mech", "fingerprint",
            "no-tls", "no-dtls", "no-cli", "verbose", f"log-file={log}", "simple-log",
            "no-stdout-log", f"pidfile={self.tmp / (self.tag + '-turnserver.pid')}",
            f"userdb={self.tmp / (self.tag + '-turndb')}",
            # the public segment is a private range here: allow relaying to it explicitly
            f"allowed-peer-ip={PUBLIC}.0-{PUBLIC}.255",
            "min-port=49152", "max-port=65535", ""]))
        conf.chmod(0o600)
        proc = subprocess.Popen(["ip", "netns", "exec", self.switch, "turnserver", "-c",
                                 str(conf)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
        self.turn = Turn(f"turn:{addr}:{TURN_PORT}", user, password, proc, log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise NetnsError(f"turnserver exited with {proc.returncode}: "
                                 f"{self.turn.log_text()[-2000:]}")
            if _udp_listening(self.switch, TURN_PORT):
                return self.turn
            time.sleep(0.05)
        raise NetnsError(f"turnserver did not listen within {timeout} s")

    def close(self) -> None:
        """Stop coturn and delete every namespace made (their links go with them)."""
        errors = []
        if self.turn is not None and self.turn.proc.poll() is None:
            self.turn.proc.terminate()
            try:
                self.turn.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.turn.proc.kill()
                self.turn.proc.wait(10)
        for ns in reversed(self._spaces):
            try:
                _run("ip", "netns", "del", ns)
            except NetnsError as exc:
                errors.append(str(exc))
        self._spaces.clear()
        if errors:
            raise NetnsError("; ".join(errors))


def _udp_listening(ns: str, port: int) -> bool:
    out = subprocess.run(["ip", "netns", "exec", ns, "ss", "-Hlun", f"sport = :{port}"],
                         capture_output=True, text=True, timeout=20).stdout
    return bool(out.strip())

