"""`swarm doctor`: what this machine can offer a swarm, and what to fix first.

The checks are plain functions of what was measured (sans-IO, tested without sockets); the
few that need I/O (a STUN exchange, a DHT lookup, the benchmark) feed them.
"""

from __future__ import annotations

import argparse
import stat
import statistics
import struct
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from swarm.commands._common import add_json_option, print_json, print_table

HELP = "check this machine: backends, GFLOPS, security key, permissions, NAT, clock"
DESCRIPTION = """\
Checks what this machine can offer a swarm and says what to fix:
  backends     each compute backend, validated or why not, with its measured GFLOPS
  security key a FIDO2 key present (needed to publish a swarm and to sign owner commands)
  data dir     the data dir is 0700 and every key file in it 0600
  udp / nat    with --stun HOST:PORT (repeatable): UDP reachability and the NAT's mapping
               (two servers tell a cone NAT from a symmetric one)
  clock        with a swarm's URI: this clock against the clocks of the swarm's members
               (commands more than 120 s off are refused as replays)
Exit status 0 when nothing failed, 4 when something this machine needs is missing.
--json prints {"ok": bool, "findings": [{"check", "status", "detail", "fix"}]}.
"""

OK, INFO, WARN, FAIL = "ok", "info", "warn", "fail"
STUN_TIMEOUT = 3.0
"""Seconds to wait for each STUN server (the request is resent after 0.5, 1 and 2 s)."""
SKEW_WARN = 5.0
"""Seconds of clock offset worth a warning (signaling and command timestamps get tight)."""
MAX_KEY_FILES = 1000


@dataclass(frozen=True)
class Finding:
    """One line of the report."""

    check: str
    """What was checked (backend:numpy, security key, data dir, nat, clock...)."""
    status: str
    """ok, info, warn (works, but worse than it could) or fail (something needed is missing)."""
    detail: str
    """What was found, with figures."""
    fix: str = ""
    """What to do about it; empty when nothing needs doing."""


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("uri", nargs="?", help="a swarm's join URI: also check the clock against "
                                          "its members")
    p.add_argument("--stun", action="append", default=[], metavar="HOST:PORT",
                   help="a STUN server to test UDP and the NAT with (repeatable; none: skipped)")
    p.add_argument("--no-bench", action="store_true",
                   help="skip the backend benchmark (validation and GFLOPS)")
    add_json_option(p, "the findings")


def run(args: argparse.Namespace) -> int:

    from swarm import loop as swarm_loop
    from swarm.commands.dht import parse_addr

    stun = [parse_addr(s.removeprefix("stun:")) for s in args.stun]
    join = None
    if args.uri:
        from swarm import uri as uri_mod

        join = uri_mod.parse(args.uri)
    findings: list[Finding] = []
    if not args.no_bench:
        findings += backend_findings(_benchmark())
    findings.append(security_key_finding(*_security_key()))
    findings += permission_findings(args.data_dir, _key_modes(args.data_dir),
                                    stat.S_IMODE(args.data_dir.stat().st_mode))
    if stun:
        local_port, answers = swarm_loop.run(stun_probe(stun, STUN_TIMEOUT))
        findings.append(nat_finding(local_port, answers))
    if join is not None:
        from swarm.errors import RemoteError

        try:
            findings.append(clock_finding(swarm_loop.run(_announced(join)), time.time()))
        except RemoteError as exc:
            findings.append(Finding("swarm", WARN, f"cannot reach the swarm: {exc}",
                                    "check the URI's bootstrap address (x.pe=HOST:PORT) and "
                                    "that UDP to it is allowed (see the udp check: --stun)"))
    ok = not any(f.status == FAIL for f in findings)
    if args.json:
        print_json({"ok": ok, "findings": [asdict(f) for f in findings]})
    else:
        print_table(("check", "status", "found", "what to do"),
                    [(f.check, f.status, f.detail, f.fix) for f in findings])
    if ok:
        return 0
    from swarm.errors import EXIT_UNAVAILABLE

    return EXIT_UNAVAILABLE


# -- checks (pure) --------------------------------------------------------------------------

def backend_findings(result: dict[str, Any]) -> list[Finding]:
    """One finding per backend of a :func:`compute.bench.benchmark` result, and a failure
    when none is usable."""
    out = []
    for row in result.get("backends", []):
        name = f"backend {row['name']}"
        if not row.get("validated"):
            out.append(Finding(name, WARN, f"unusable: {row.get('reason')}",
                               _BACKEND_FIX.get(row["name"], "see the reason")))
            continue
        gflops = max((float(g) for g in row.get("gflops", {}).values()), default=0.0)
        adapter = row.get("adapter") or {}
        device = adapter.get("name") or "CPU"
        if str(adapter.get("type", "")).lower() == "cpu" and row["name"] == "wgpu":
            out.append(Finding(name, INFO, f"validated on {device}, a CPU rasteriser: "
                               f"{gflops:.1f} GFLOPS", "no GPU found; install the GPU's "
                               "Vulkan/Metal/D3D12 driver to offer it (numpy is used "
                               "meanwhile)"))
        else:
            out.append(Finding(name, OK, f"validated on {device}: {gflops:.1f} GFLOPS"))
    if not any(f.status in (OK, INFO) for f in out):
        out.append(Finding("backends", FAIL, "no usable compute backend: this machine cannot "
                           "serve tasks", "install numpy with a working BLAS (pip install "
                           "--force-reinstall numpy), then run `swarm bench`"))
    return out


_BACKEND_FIX = {
    "wgpu": "install a GPU driver with Vulkan, Metal or D3D12 (or Mesa for a CPU fallback)",
    "numpy": "reinstall numpy (pip install --force-reinstall numpy); check `swarm bench`",
}


def security_key_finding(present: bool, detail: str) -> Finding:
    if present:
        return Finding("security key", OK, detail)
    return Finding("security key", WARN, detail,
                   "needed only to publish a swarm or sign owner commands: plug in a FIDO2 "
                   "key; on Linux allow access to /dev/hidraw* with a udev rule "
                   "(or use --owner-key soft:PATH for tests, not hardware-backed)")


def permission_findings(data_dir: Path, key_modes: Iterable[tuple[Path, int]],
                        dir_mode: int) -> list[Finding]:
    """The data dir must be 0700 and key files 0600: keys are refused when others can
    read them (invariant 5)."""
    out = []
    if dir_mode & 0o077:
        out.append(Finding("data dir", WARN, f"{data_dir} has mode {dir_mode:o}",
                           f"chmod 700 {data_dir}"))
    else:
        out.append(Finding("data dir", OK, f"{data_dir} (mode {dir_mode:o})"))
    keys = list(key_modes)
    loose = [(p, m) for p, m in keys if m & 0o077]
    for path, mode in loose:
        out.append(Finding("key file", FAIL, f"{path} has mode {mode:o}: swarm refuses "
                           "to load it", f"chmod 600 {path}"))
    if not loose:
        out.append(Finding("key files", OK if keys else INFO,
                           f"{len(keys)} key file(s), all 0600" if keys else
                           "no key yet (created on first publish or join)"))
    return out


def nat_finding(local_port: int, answers: Sequence[tuple[tuple[str, int], str,
                                                         tuple[str, int] | None]]) -> Finding:
    """What STUN answers say about UDP from this machine.

    ``answers``: per server, (server, the local address that reaches it, the mapped address
    it saw or None). Same mapping from every server = endpoint-independent (cone) NAT;
    different mappings = symmetric NAT, where direct connections need a relay."""
    seen = [(server, local, mapped) for server, local, mapped in answers if mapped is not None]
    silent = [f"{h}:{p}" for (h, p), _, mapped in answers if mapped is None]
    if not seen:
        return Finding("udp", FAIL, f"no STUN answer from {', '.join(silent)} in "
                       f"{STUN_TIMEOUT:g} s: outgoing UDP is blocked, or the server is down",
                       "allow outgoing UDP (a firewall), check the server, or reach the swarm "
                       "through a TURN relay")
    mapped = {m for _, _, m in seen}
    note = f" (no answer from {', '.join(silent)})" if silent else ""
    shown = ", ".join(f"{h}:{p}" for h, p in sorted(mapped))
    if all(m == (local, local_port) for _, local, m in seen):
        return Finding("nat", OK, f"no NAT: peers see this machine at {shown}{note}")
    if len(mapped) > 1:
        return Finding("nat", WARN, f"symmetric NAT: each server sees another address "
                       f"({shown}){note}", "peers behind other NATs cannot reach this machine "
                       "directly: configure a TURN relay, or forward a UDP port on the router")
    if len(seen) == 1:
        return Finding("nat", INFO, f"behind a NAT, mapped to {shown}{note}",
                       "give two STUN servers to tell a cone NAT from a symmetric one")
    return Finding("nat", OK, f"cone NAT (the same mapping {shown} for every server): direct "
                   f"connections work through STUN{note}")


def clock_finding(announced_at: Sequence[float], now: float) -> Finding:
    """This clock against the members': each announcement was made at most
    :func:`announce_period` s before it was read, so a member's clock is ``announced - now``
    to that plus the period ahead of ours. The medians over members bound the offset
    (positive: ours is behind)."""
    if not announced_at:
        return Finding("clock", INFO, "no member announcements to compare with",
                       "try again once the swarm has members")
    low = statistics.median(a - now for a in announced_at)
    high = low + announce_period()
    limit = _command_age()
    span = f"{low:+.0f} to {high:+.0f} s against {len(announced_at)} member(s)"
    fix = "turn on time sync (NTP): e.g. `timedatectl set-ntp true`"
    if low > limit or high < -limit:
        return Finding("clock", FAIL, f"this clock is off by more than {limit:g} s ({span}): "
                       "owner commands and signaling from here are refused as replays", fix)
    if low > SKEW_WARN or high < -SKEW_WARN:
        return Finding("clock", WARN, f"this clock is off ({span})", fix)
    return Finding("clock", OK, f"within the members' clocks ({span}; positive: theirs ahead)")


def _announce_ttl() -> float:
    """Lifetime members give their announcements: each was made at its expiry less this."""
    from swarm.members import ANNOUNCE_TTL

    return ANNOUNCE_TTL


def announce_period() -> float:
    """Most seconds an announcement is older than its member's clock (the re-announce period,
    a third of the lifetime, and a lookup)."""
    return _announce_ttl() / 3 + 5.0


def _command_age() -> float:
    from swarm.control.replay import COMMAND_AGE

    return COMMAND_AGE


# -- what the checks are fed (I/O) ----------------------------------------------------------

def _benchmark() -> dict[str, Any]:
    from compute.bench import benchmark

    return benchmark(quick=True)


def _security_key() -> tuple[bool, str]:
    from swarm.commands.owned import open_owner_key
    from swarm.errors import LocalError

    try:
        auth = open_owner_key("fido2")
    except LocalError:
        return False, "no FIDO2 security key found (USB or NFC)"
    try:
        return True, auth.description
    finally:
        auth.close()


def _key_modes(data_dir: Path) -> list[tuple[Path, int]]:
    """Every ``*.key`` file under the data dir with its permission bits (bounded)."""
    out = []
    for path in sorted(data_dir.rglob("*.key"))[:MAX_KEY_FILES]:
        if path.is_file() and not path.is_symlink():
            out.append((path, stat.S_IMODE(path.stat().st_mode)))
    return out


async def _announced(join) -> list[float]:
    """When each live member of the swarm made its announcement, by its own clock."""
    from swarm.control import observer
    from swarm.members import membership_topic

    async with observer.dht_observer(join) as node:
        anns = await node.get_peers(membership_topic(join.swarm_id))
    return [a.expires_at - _announce_ttl() for a in anns]


async def stun_probe(servers: Sequence[tuple[str, int]], timeout: float = STUN_TIMEOUT
                     ) -> tuple[int, list[tuple[tuple[str, int], str, tuple[str, int] | None]]]:
    """Ask each STUN server, from one local UDP port (one mapping to compare), which address
    it sees; bounded. Answers are matched by transaction id; anything else is dropped."""
    import asyncio

    from aioice import stun

    from swarm.netaddr import source_address

    waiting: dict[bytes, asyncio.Future] = {}

    class Client(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
            try:
                msg = stun.parse_message(data)
            except (ValueError, KeyError, IndexError, struct.error):
                return  # not STUN, or garbled
            fut = waiting.get(msg.transaction_id)
            mapped = msg.attributes.get("XOR-MAPPED-ADDRESS") or msg.attributes.get(
                "MAPPED-ADDRESS")
            if (fut is not None and not fut.done() and msg.message_class == stun.Class.RESPONSE
                    and isinstance(mapped, tuple)):
                fut.set_result((str(mapped[0]), int(mapped[1])))

    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(Client, local_addr=("0.0.0.0", 0))
    port = transport.get_extra_info("sockname")[1]

    async def ask(server: tuple[str, int]):
        request = stun.Message(stun.Method.BINDING, stun.Class.REQUEST)
        fut = loop.create_future()
        waiting[request.transaction_id] = fut
        deadline = loop.time() + timeout
        resend = 0.5
        try:
            while (left := deadline - loop.time()) > 0:
                transport.sendto(bytes(request), server)
                try:
                    return await asyncio.wait_for(asyncio.shield(fut), min(resend, left))
                except TimeoutError:
                    resend *= 2
            return None
        except OSError:  # no route, unreachable
            return None
        finally:
            waiting.pop(request.transaction_id, None)

    try:
        mapped = await asyncio.gather(*(ask(s) for s in servers))
    finally:
        transport.close()
    return port, [(s, source_address([s], default=""), m)
                  for s, m in zip(servers, mapped, strict=True)]
