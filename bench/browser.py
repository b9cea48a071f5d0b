"""Browser tabs as workers: tab join time, shard round trip, tab vs native throughput.

Runs a published swarm (`swarm publish --http`) and headless Chromium (the system's
package, WebGPU through SwiftShader) in one test host (a network namespace, so root), on
the same machine, and takes the docs' screenshots of the join page and the status panel.

    sudo python bench/browser.py [--joins 5] [--jobs 3] [--json] [--shots docs/img]

Figures, medians over the runs:
- join: click "This time" -> the node announced the tab (self-test, speed measurement,
  signaling, WebRTC, the node's validation matmul, the tab-signed record in the DHT);
  also the node's validation round trip alone;
- shard round trip per worker kind, from `swarm submit --json` (the requester's own clock);
- throughput of square float32 matmuls: the tab on WebGPU and on its JavaScript fallback,
  next to the native worker's backends (numpy; wgpu on this machine's adapter).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import subprocess_env, swarm_cmd  # noqa: E402
from tests.system.browser import Browser, missing  # noqa: E402
from tests.system.netns import Net  # noqa: E402
from tests.system.support import NetCluster  # noqa: E402
from tests.system.test_browser import LINK, wait_state  # noqa: E402

SIZES = (256, 512)


def ms(values: list[float]) -> dict:
    return {"median_ms": round(statistics.median(values) * 1e3, 1),
            "min_ms": round(min(values) * 1e3, 1), "runs": len(values)}


def native_gflops(size: int) -> dict:
    import compute

    out = {}
    a = np.random.default_rng(0).standard_normal((size, size)).astype(np.float32)
    for name in ("numpy", "wgpu"):
        try:
            backend = compute.get_backend(name, threads=1) if name == "numpy" else \
                compute.get_backend(name)
        except Exception as exc:  # no adapter at all
            out[name] = f"unavailable: {exc}"[:60]
            continue
        backend.matmul(a, a)
        runs, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 0.6 or runs == 0:
            backend.matmul(a, a)
            runs += 1
        out[name] = round(2 * size ** 3 * runs / (time.perf_counter() - t0) / 1e9, 3)
    return out


def tab_gflops(page, size: int) -> dict:
    return page.evaluate("""async (size) => {
        const { measure, gpuBackend } = await import("/static/gpu.js");
        const { cpuBackend } = await import("/static/cpu.js");
        const gpu = await gpuBackend("/kernel/matmul_tiled.wgsl");
        return { webgpu: gpu ? await measure(gpu, size, 600) * 1000 : null,
                 cpu: await measure(cpuBackend(), size, 600) * 1000 };
    }""", size)


def run(joins: int, jobs: int, shots: Path | None) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="bench-browser-"))
    with Net() as net, closing(NetCluster(tmp, net)) as cluster:
        host = net.host("a")
        pub = cluster.start("pub", host, swarm_cmd(
            "publish", "--name", "bench", "--owner-key", f"soft:{tmp / 'owner.key'}",
            "--backend", "numpy", "--host", host.addr, "--http", "127.0.0.1:0",
            "--data-dir", str(tmp / "pub")))
        uri = pub.wait_line(lambda s: s.startswith("magnet:?"), 90, "out")
        url = LINK.search(pub.wait_line(lambda s: bool(LINK.search(s)), 30)).group(1)
        native = pub.peer
        b = Browser(tmp, host.ns)
        try:
            join_s, check_s, page = [], [], None
            for i in range(joins):
                if page is not None:
                    page.close()
                page = b.page()
                page.goto(url)
                button = page.get_by_role("button", name="This time", exact=True)
                button.wait_for()
                if i == 0 and shots:
                    page.screenshot(path=str(shots / "browser_join.png"))
                t0 = time.perf_counter()
                button.click()
                if wait_state(page, ("joined", "refused", "failed", "declined-gpu")) != "joined":
                    raise RuntimeError(page.locator("#state").inner_text())
                join_s.append(time.perf_counter() - t0)
                check_s.append(page.evaluate("window.swarmTab.checkSeconds"))
            tab = page.evaluate("window.swarmTab.peer")
            rtt: dict[str, list[float]] = {"browser tab": [], "native worker": []}
            shards = {"browser tab": 0, "native worker": 0}
            rng = np.random.default_rng(0)
            for j in range(jobs):
                a = rng.standard_normal((1024, 256)).astype(np.float32)
                np.save(tmp / "A.npy", a)
                np.save(tmp / "B.npy", a[:256].copy())
                res = subprocess.run(host.wrap(swarm_cmd(
                    "submit", uri, "matmul", str(tmp / "A.npy"), str(tmp / "B.npy"), "-o",
                    str(tmp / "C.npy"), "--json", "--min-workers", "2",
                    "--data-dir", str(tmp / f"rq{j}"))), capture_output=True, text=True,
                    timeout=300, env=subprocess_env())
                if res.returncode:
                    raise RuntimeError(res.stderr[-800:])
                for row in json.loads(res.stdout)["peers"]:
                    kind = "browser tab" if row["peer"] == tab else \
                        "native worker" if row["peer"] == native else None
                    if kind and row["shards"]:
                        rtt[kind].append(row["seconds"] / row["shards"])
                        shards[kind] += row["shards"]
            if shots:
                status = b.page()
                status.goto(url + "status")
                wait_state(status, ("live",))
                status.wait_for_timeout(2500)  # a few samples on the plot
                status.screenshot(path=str(shots / "browser_status.png"), full_page=True)
            speeds = []
            for size in SIZES:
                t = tab_gflops(page, size)
                n = native_gflops(size)
                speeds.append({"n": size, "tab WebGPU GFLOPS": t["webgpu"],
                               "tab JS CPU GFLOPS": round(t["cpu"], 3),
                               "native numpy GFLOPS (1 thread)": n["numpy"],
                               "native wgpu GFLOPS": n["wgpu"]})
        finally:
            b.close()
    return {"join": [{"figure": "click -> joined (announced)"} | ms(join_s),
                     {"figure": "node's validation matmul round trip"} | ms(check_s)],
            "shards": [{"worker": k, "shards": shards[k]} | (ms(v) if v else {})
                       for k, v in rtt.items()],
            "throughput": speeds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--joins", type=int, default=5)
    p.add_argument("--jobs", type=int, default=3)
    p.add_argument("--shots", type=Path, default=None, help="write PNG screenshots here")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if why := missing():
        sys.exit(f"bench/browser.py: {why}")
    d = run(args.joins, args.jobs, args.shots)
    if args.json:
        print(json.dumps(d, indent=1))
        return
    for section, rows in d.items():
        print(f"\n{section}")
        cols = list(dict.fromkeys(k for r in rows for k in r))
        print(" | ".join(cols))
        for r in rows:
            print(" | ".join(str(r.get(c, "")) for c in cols))


if __name__ == "__main__":
    main()
