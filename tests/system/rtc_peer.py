"""One WebRTC peer for the NAT testbed: ``python -m tests.system.rtc_peer ROLE DIR SEED PEER``.

Signals travel out of band through files in DIR (both namespaces share the file system; the
testbed tests ICE paths, not signaling): ROLE "dial" connects to PEER and measures setup time,
round trips and throughput over the chosen path, then prints one JSON line; ROLE "answer"
accepts one link and echoes until it closes. ICE servers come from ``SWARM_ICE_SERVERS``.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

from identity.keys import PeerId, PeerKey
from swarm.links.echo import serve, throughput
from swarm.links.ice import ice_servers
from swarm.links.webrtc import WebRTCEndpoint, selected_path

CHUNK = 64 << 10


class FileSignaler:
    """Signals as files DIR/<receiver hex>-<n>; polled every 20 ms."""

    def __init__(self, key: PeerKey, root: Path) -> None:
        self.key, self.root, self._callbacks, self._n = key, root, [], 0
        self._task = asyncio.ensure_future(self._poll())

    async def send(self, to: PeerId, addr, payload: bytes) -> None:
        self._n += 1
        tmp = self.root / f".{to.raw.hex()}-{self.key.peer_id.raw.hex()}-{self._n}"
        tmp.write_bytes(payload)
        tmp.rename(self.root / tmp.name[1:])

    def on_message(self, callback):
        self._callbacks.append(callback)

    async def _poll(self) -> None:
        me = self.key.peer_id.raw.hex()
        while True:
            for f in sorted(self.root.glob(f"{me}-*")):
                sender = PeerId(bytes.fromhex(f.name.split("-")[1]))
                data = f.read_bytes()
                f.unlink()
                for cb in self._callbacks:
                    cb(sender, ("0.0.0.0", 0), data)
            await asyncio.sleep(0.02)


async def main(role: str, root: Path, seed: str, peer: str, mb: int) -> None:
    key = PeerKey.from_seed(bytes.fromhex(seed))
    other = PeerId(bytes.fromhex(peer))
    servers = ice_servers([], os.environ)
    got: asyncio.Future = asyncio.get_running_loop().create_future()
    ep = WebRTCEndpoint(key, FileSignaler(key, root), ice_servers=servers,
                        on_link=lambda link: got.done() or got.set_result(link),
                        connect_timeout=float(os.environ.get("RTC_TIMEOUT", "30")))
    try:
        if role == "answer":
            print("ready", flush=True)
            await serve(await got)
            return
        t0 = time.perf_counter()
        try:
            link = await ep.connect(other, ("0.0.0.0", 0))
        except (TimeoutError, ConnectionError) as exc:
            print(json.dumps({"ok": False, "error": str(exc),
                              "seconds": time.perf_counter() - t0}), flush=True)
            return
        setup = time.perf_counter() - t0
        rtts = [await link.ping(10) for _ in range(20)]
        rate = await throughput(link, mb << 20, CHUNK)
        print(json.dumps({"ok": True, "path": selected_path(link.pc), "setup_ms": setup * 1e3,
                          "rtt_ms": statistics.median(rtts) * 1e3,
                          "mb_s": rate}), flush=True)
        await link.close("done")
    finally:
        await ep.close()


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=os.environ.get("RTC_LOG", "WARNING"))
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4],
                     int(os.environ.get("RTC_MB", "8"))))


def run_pair(dialer, answerer, root: Path, ice: list[dict] | None, mb: int = 4,
             timeout: float = 20.0) -> dict:
    """Run an answering peer on ``answerer`` and a dialing one on ``dialer`` (test hosts);
    the dialer's JSON result. Both processes are gone when this returns."""
    import subprocess
    import tempfile

    from tests.conftest import read_line, subprocess_env

    ka, kb = PeerKey.generate(), PeerKey.generate()
    d = Path(tempfile.mkdtemp(dir=root))
    env = subprocess_env(RTC_MB=str(mb), RTC_TIMEOUT=str(timeout))
    if ice:
        env["SWARM_ICE_SERVERS"] = json.dumps(ice)
    cmd = [sys.executable, "-m", "tests.system.rtc_peer"]
    with open(d / "answer.err", "w") as err:
        ans = subprocess.Popen(answerer.wrap([*cmd, "answer", str(d), kb.seed().hex(),
                                              ka.peer_id.raw.hex()]),
                               stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    try:
        assert read_line(ans, 60).strip() == "ready", (d / "answer.err").read_text()
        res = subprocess.run(dialer.wrap([*cmd, "dial", str(d), ka.seed().hex(),
                                          kb.peer_id.raw.hex()]),
                             capture_output=True, text=True, env=env, timeout=timeout + 90)
    finally:
        ans.kill()
        ans.wait(10)
        ans.stdout.close()
    lines = res.stdout.strip().splitlines()
    if res.returncode != 0 or not lines:
        raise AssertionError(f"dialer failed: {res.stderr[-3000:]}")
    return json.loads(lines[-1])
