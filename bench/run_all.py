"""Run every benchmark script with --json (each in its own process, time-bounded) and write
docs/benchmarks.md with tables and PNG plots under docs/img/. `make bench` runs it.

    python bench/run_all.py [--quick] [--only NAME ...] [--out docs]
    python bench/run_all.py --from-json docs/benchmarks.json   # re-render only

Every figure is captioned with how it was measured: machine (CPU model, cores, load),
date, and the exact command. A script that fails or runs out of time gets a line saying so,
and the rest still run."""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RAY_PYTHON = os.environ.get("SWARM_BENCH_RAY_PYTHON", ".venv-ray/bin/python")
"""The interpreter that runs bench/runtime.py's Ray rows (``make bench`` creates .venv-ray;
relative to the repository, where every script runs, so that captions name no home dir)."""

# name -> (script args, quick args, time limit s, what it shows)
BENCHES: dict[str, tuple[list[str], list[str], int, str]] = {
    "compute": ([], ["--quick"], 900,
                "WGSL kernels (tiled vs naive), numpy backend overhead, Freivalds' cost"),
    "transport": (["--mb", "64", "--standard-mb", "16"],
                  ["--mb", "16", "--standard-mb", "4", "--runs", "1", "--pings", "50"], 600,
                  "peer-link throughput and round trip by link kind (two processes, loopback)"),
    "dht": (["--nodes", "100", "--items", "30", "--gets", "100"],
            ["--nodes", "40", "--items", "10", "--gets", "40"], 600,
            "DHT put/get latency and success before and after killing 30% of the nodes"),
    "dht_mainline": (["--nodes", "52", "--items", "15"], ["--nodes", "20", "--items", "4"], 600,
                     "swarm nodes (KRPC) and libtorrent side by side in one mainline DHT: BEP 44 "
                     "put/get, gets after killing 30%, reflection amplification"),
    "runtime": (["--runs", "3", "--require-ray", "--ray-python", RAY_PYTHON],
                ["--quick", "--require-ray", "--ray-python", RAY_PYTHON], 1500,
                "sharded, verified matmul on swarm.local(workers=2) vs numpy and Ray (Ray from "
                "its own venv, `make bench` installs it: a missing Ray row fails the run); "
                "three separate runs, each row the median of the runs (every run's ratio "
                "beside it); vs_floor: speed relative to the same work split over two bare "
                "single-threaded processes holding their operands (no transfer, no checks), "
                "timed in the same rounds"),
    "tls_offload": ([], ["--mb", "16", "--repeats", "1"], 300,
                    "TLS record work off the event-loop thread (issue 17): decrypting and "
                    "encrypting on the loop thread, in a second thread while the loop "
                    "sleeps, and in a second thread while the loop runs Python (the GIL)"),
    "nat": (["--runs", "3", "--mb", "8"], ["--runs", "1", "--mb", "2"], 1200,
            "WebRTC across NATs (network namespaces, iptables, coturn; needs root): "
            "{public, cone, symmetric} x {same}, with and without TURN"),
    "identity": (["--n", "30"], ["--n", "10"], 300,
                 "owner ceremony timings with the software authenticator"),
    "control": (["--rounds", "3", "--trials", "10"], ["--rounds", "1", "--trials", "2"], 1500,
                "control plane: join, failover after SIGKILL, handoff after SIGTERM; "
                "failover as `swarm status` shows it (issue 48)"),
    "generate": (["--runs", "3"], ["--runs", "1", "--decode", "8"], 900,
                 "SmolLM2-135M prefill and decode tokens/s: llama.cpp (2 threads, and 1; "
                 "from .venv-llama, `make bench` builds it) vs the local numpy forward; one "
                 "layer's products at batch 1 and 16 and their fingerprint check"),
    "startup": (["--runs", "30"], ["--runs", "5"], 300,
                "start-up of `swarm --help` and of `swarm dht serve` until it listens"),
    "embed": (["--runs", "5"], ["--quick"], 2400,
              "all-MiniLM-L6-v2 sentences/s: sentence-transformers (torch CPU, 2 threads, its own "
              "venv .venv-st) vs the numpy forward vs swarm.local(2) verified and unverified "
              "(each chunk's six layers on a worker, every product checked here) vs per "
              "product (the design first shipped: each weight product a verified matmul job) "
              "vs two workers on network-namespace hosts (verified; needs root), round robin "
              "in one run; check % = the CPU the Freivalds checks add (the requester's pass "
              "over recorded chunks replayed with and without them) over the verified job's "
              "CPU (requester + workers)"),
    "train": (["--runs", "3"], ["--quick"], 1800,
              "data-parallel training, every gradient checked: samples/s of swarm.local(2) vs "
              "the local numpy loop (and torch from .venv-st when present) for mlp:784-128-10 "
              "and mlp:784-1024-1024-10; the check's share of the job's CPU; the 10-epoch "
              "run's test accuracy"),
    "embed_soak": ([], ["--batches", "200"], 1200,
                   "MiniLM worker memory on swarm.local(2): RSS (MiB) per worker before the "
                   "weights, after the first batch, after a second embedder on the same weights, "
                   "every 100 batches of 4 sentences"),
    "browser": (["--joins", "5", "--jobs", "3", "--shots", "docs/img"],
                ["--joins", "2", "--jobs", "1", "--shots", "docs/img"], 600,
                "browser tabs (headless Chromium, WebGPU on SwiftShader) as workers beside a "
                "native worker on the same machine: join time, shard round trip, throughput; "
                "needs root (a network namespace) and the chromium package"),
}


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{model}, {os.cpu_count()} logical CPUs, {platform.system()} "
            f"{platform.release()}, Python {platform.python_version()}")


def run(name: str, quick: bool) -> dict:
    args, quick_args, limit, _ = BENCHES[name]
    cmd = [sys.executable, f"bench/{name}.py", "--json", *(quick_args if quick else args)]
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    try:
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=limit,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)))
        data = json.loads(res.stdout) if res.returncode == 0 else None
        error = None if data is not None else (res.stderr.strip()[-400:] or f"rc {res.returncode}")
    except subprocess.TimeoutExpired:
        data, error = None, f"no result within {limit} s"
    except ValueError as exc:
        data, error = None, f"unreadable JSON: {exc}"
    return {"name": name, "command": "python " + " ".join(cmd[1:]), "data": data,
            "error": error, "seconds": round(time.monotonic() - t0, 1), "load_1m": load,
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine()}


# -- tables and plots per script --------------------------------------------------------------

def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def _table(cols: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(_fmt(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _records(rows: list[dict]) -> str:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    return _table(cols, [[r.get(c, "") for c in cols] for r in rows])


def _bars(path: Path, title: str, labels: list[str], series: dict[str, list[float]],
          unit: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 0.45 * len(labels) * max(1, len(series)) + 1.2))
    h = 0.8 / max(1, len(series))
    for i, (name, vals) in enumerate(series.items()):
        ax.barh([j + i * h for j in range(len(labels))], vals, height=h, label=name)
    ax.set_yticks([j + h * (len(series) - 1) / 2 for j in range(len(labels))], labels,
                  fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(unit, fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
    if len(series) > 1:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def render(r: dict, img: Path) -> tuple[str, list[tuple[str, str]]]:
    """Markdown tables and [(png name, caption)] for one script's JSON."""
    d, name = r["data"], r["name"]
    plots: list[tuple[str, str]] = []
    if name == "compute":
        md = ["Kernels (llvmpipe or the machine's GPU adapter):", "", _records(d["kernels"]),
              "", "numpy backend vs raw `a @ b`:", "", _records(d["numpy_overhead"]), "",
              "Freivalds' check:", "", _records(d["freivalds"]), "",
              "Honest products under Freivalds' check (false rejections must be 0; KAPPA must "
              "stay above the worst ratio):", "", _records(d["honesty"])]
        ns = [f"n={k['n']}" for k in d["kernels"]]
        _bars(img / "compute_kernels.png", "WGSL matmul GFLOPS", ns,
              {"naive": [k["naive_gflops"] for k in d["kernels"]],
               "tiled": [k["tiled_gflops"] for k in d["kernels"]]}, "GFLOPS")
        plots.append(("compute_kernels.png", "tiled vs naive WGSL kernel"))
        _bars(img / "compute_freivalds.png", "Freivalds' check, % of the product's time",
              [f"n={f['n']}" for f in d["freivalds"]],
              {"median": [f["cost_pct_median"] for f in d["freivalds"]],
               "best": [f["cost_pct_best"] for f in d["freivalds"]]}, "% of matmul time")
        plots.append(("compute_freivalds.png", "Freivalds overhead"))
    elif name == "nat":
        rows = [{k: r.get(k, "-") for k in ("dialer", "answerer", "turn", "connected", "path",
                                             "setup_ms", "rtt_ms", "mb_s")}
                for r in d["results"]]
        md = [_records(rows), "",
              "path: the nominated ICE pair, local-remote (host, srflx, prflx = peer-reflexive, "
              "relay = TURN). setup_ms: signaling + ICE + DTLS + SCTP until the data channel "
              "opens; rtt_ms: link ping; mb_s: one-way, 64 KiB messages. With a TURN server "
              "configured the tuning (large SCTP chunks) is off, since the candidates are no "
              "longer all LAN host candidates: stock aiortc speed even on direct paths."]
    elif name == "transport":
        kinds = list(d["detail"])
        md = [_records([{"link": k} | {x: v for x, v in d["detail"][k].items()}
                        for k in kinds]), "", f"event loop: {d.get('event_loop')}"]
        _bars(img / "transport.png", "peer-link throughput (MB/s, loopback)", kinds,
              {"MB/s": [d["detail"][k]["mb_s"] for k in kinds]}, "MB/s")
        plots.append(("transport.png", "throughput by link kind"))
    elif name == "dht":
        phases = [k for k in ("put", "get", "get_after_churn", "get_after_churn_again")
                  if k in d]
        md = [f"{d['nodes']} nodes in one process, {d.get('churn', 0):.0%} killed between "
              "phases", "", _records([{"phase": p} | d[p] for p in phases])]
        _bars(img / "dht.png", f"DHT latency, {d['nodes']} nodes", phases,
              {"median": [d[p]["median_ms"] for p in phases],
               "p99": [d[p]["p99_ms"] for p in phases]}, "ms")
        plots.append(("dht.png", "DHT latency before/after churn"))
    elif name == "dht_mainline":
        rows = [{"operation": op, "who": who} | d[op][who]
                for op in ("put", "get", "get_after_churn") for who in ("libtorrent", "swarm")]
        md = [f"{d['libtorrent']} libtorrent sessions + {d['swarm']} swarm nodes, "
              f"{d['items']} mutable items per side; libtorrent's get time is to its first "
              "alert with the value; all swarm nodes share one Python process", "",
              _records(rows)]
        m = d.get("membership")
        if m:
            md += ["", f"Membership: {m['members']} swarm members announce under one topic "
                   "(signed entries on swarm nodes, addresses on libtorrent nodes by BEP 5, "
                   "each entry also a BEP 44 item); swarm's get_peers succeeds when it returns "
                   "every signed entry, libtorrent's BEP 5 get_peers (addresses only, first "
                   "reply) when it lists any", "",
                   _records([{"operation": f"topic {op}", "who": who} | m[op][who]
                             for op, who in (("announce", "swarm"), ("get_peers", "swarm"),
                                             ("get_peers", "libtorrent"))])]
        amp = d.get("amplification", {})
        if amp:
            before = {x["request"]: x for x in amp.get("before", [])}
            md += ["", "Reply/request bytes from a never-seen address"
                   + (f" (before: commit {amp.get('before_commit')})" if before else ""), "",
                   _records([{"request": x["request"], "request_bytes": x["request_bytes"],
                              "ratio_before": before.get(x["request"], {}).get("ratio", "-"),
                              "ratio_after": x["ratio"],
                              "after_round_trip_bytes": x["after_round_trip_bytes"] or "-"}
                             for x in amp["after"]])]
        _bars(img / "dht_mainline.png", "BEP 44 get, median ms", ["get", "get_after_churn"],
              {who: [d[p][who]["median_ms"] for p in ("get", "get_after_churn")]
               for who in ("libtorrent", "swarm")}, "ms")
        plots.append(("dht_mainline.png", "swarm vs libtorrent BEP 44 gets"))
    elif name == "runtime":
        rows = d["results"]
        md = [_records(rows), "", f"meta: {json.dumps(d.get('meta', {}))}", "",
              "load_1m: each run's 1-minute load (other work on the machine). numpy's one "
              "product on two BLAS threads loses most when another process takes a core "
              "(on an idle machine it took 0.54 s, Ray 0.57 s); compare within a run. Where "
              "the time goes: docs/architecture.md, runtime, Figures."]
        timed = [x for x in rows if x.get("gflops")]
        if timed:
            _bars(img / "runtime.png", "matmul GFLOPS by runner",
                  [f"{x['case']} / {x['runner']}"[:48] for x in timed],
                  {"GFLOPS": [x["gflops"] for x in timed]}, "GFLOPS")
            plots.append(("runtime.png", "swarm vs numpy vs Ray"))
    elif name == "identity":
        timings = {k: v for k, v in d.items() if "bytes" not in k}
        md = ["Times in ms (sizes in bytes).", "",
              _records([{"figure": k} | v for k, v in d.items()])]
        _bars(img / "identity.png", "owner ceremony (software key), ms", list(timings),
              {"median": [v["median"] for v in timings.values()]}, "ms")
        plots.append(("identity.png", "ceremony timings"))
    elif name == "control":
        s = d["summary"]
        md = [_records([{"measure (s)": k} | v for k, v in s.items()])]
        if d.get("cli"):
            c = d["cli"]
            md += ["", f"Failover as `swarm status --json` shows it ({c['trials']} CLI trials): "
                   f"median {c['median']:.2f} s, max {c['max']:.2f} s, one claim round in "
                   f"{c['one_round']} of {c['trials']}."]
        _bars(img / "control.png", "control plane on loopback, seconds", list(s),
              {"median": [v["median"] for v in s.values()]}, "s")
        plots.append(("control.png", "join, failover and handoff times"))
    elif name == "tls_offload":
        md = [_records([{k: "" if v is None else v for k, v in row.items()}
                        for row in d["rows"]]), "", f"meta: {json.dumps(d['meta'])}"]
    elif name == "generate":
        md = [_records(d["rows"]), "", "Layer 0's weight products, one BLAS thread (us):", "",
              _records(d["layers"]), "", f"meta: {json.dumps(d['meta'])}"]
    elif name == "startup":
        md = [_records([{"tree": tree} | figures for tree, figures in d.items()])]
    elif name == "embed":
        md = [_records(d["rows"]), "", f"meta: {json.dumps(d['meta'])}"]
    elif name == "train":
        md = [_records([{"model": m} | {k: round(v, 3) for k, v in row.items()}
                        for m, row in d["rows"].items()]), "",
              f"batch {d['batch']}, {d['steps']} steps, median of {d['runs']}; torch: "
              f"{d['torch']}; full run: {json.dumps(d['full_run'])}"]
    elif name == "browser":
        md = ["Joining (medians):", "", _records(d["join"]), "",
              "Shard round trip per worker, from `swarm submit --json`:", "",
              _records(d["shards"]), "", "Throughput of square float32 matmuls:", "",
              _records(d["throughput"]), "",
              "![join page](img/browser_join.png)", "",
              "![status panel](img/browser_status.png)"]
        t = d["throughput"]
        cols = [c for c in t[0] if c != "n"]
        _bars(img / "browser.png", "tab vs native worker, same machine, GFLOPS",
              [f"n={x['n']}" for x in t],
              {c: [x[c] if isinstance(x[c], int | float) else 0.0 for x in t] for c in cols},
              "GFLOPS")
        plots.append(("browser.png", "tab vs native worker throughput"))
    else:
        md = ["```", json.dumps(d, indent=1)[:4000], "```"]
    return "\n".join(md), plots


def headlines(results: list[dict]) -> list[str]:
    """The ratios the README quotes, from whatever scripts produced data."""
    d = {r["name"]: r["data"] for r in results if r["data"] is not None}
    out = []
    try:
        if "compute" in d:
            k = d["compute"]["kernels"][-1]
            f = d["compute"]["freivalds"][-1]
            out.append(f"tiled WGSL kernel {k['speedup']:.1f}x the naive one at n={k['n']} "
                       f"({k['adapter']})")
            out.append(f"Freivalds' check costs {f['cost_pct_median']:.1f}% of the product "
                       f"at n={f['n']} (median)")
        if "runtime" in d:
            for x in d["runtime"]["results"]:
                if x.get("vs_numpy") and x["runner"].startswith("swarm"):
                    out.append(f"{x['case']}, {x['runner']}: {x['vs_numpy']:.2f}x numpy's speed"
                               + (f", {x['vs_floor']:.2f}x the floor" if x.get("vs_floor")
                                  else ""))
        if "transport" in d:
            t = d["transport"]
            out.append(f"links: TLS {t['tls_mb_s']} MB/s"
                       + (f" (on one host, shared memory: {t['shm_mb_s']} MB/s)"
                          if t.get("shm_mb_s") else "")
                       + f", tuned WebRTC {t['webrtc_mb_s']} MB/s"
                       + (f", stock WebRTC {t['webrtc_standard_mb_s']} MB/s"
                          if t.get("webrtc_standard_mb_s") else ""))
        if "control" in d:
            c = d["control"]["summary"]
            out.append(f"failover after SIGKILL {c['failover']['median']:.2f} s, handoff "
                       f"after SIGTERM {c['handoff']['median']:.2f} s (medians)")
        if "dht" in d:
            g = d["dht"]
            out.append(f"DHT gets after killing {g['churn']:.0%} of {g['nodes']} nodes: "
                       f"{g['get_after_churn']['success']:.0%} found the newest value")
        if "browser" in d:
            j, sh = d["browser"]["join"][0], {r["worker"]: r for r in d["browser"]["shards"]}
            out.append(f"a browser tab joins in {j['median_ms'] / 1e3:.2f} s (median); shard "
                       f"round trip tab {sh['browser tab']['median_ms']:.0f} ms vs native "
                       f"{sh['native worker']['median_ms']:.0f} ms")
        if "embed" in d:
            rows = [r for r in d["embed"]["rows"] if r.get("verified / torch")]
            ratios = sorted(r["verified / torch"] for r in rows)
            checks = sorted(r["check % of job CPU"] for r in rows)
            out.append(f"MiniLM embeddings, every product verified on swarm.local(2): "
                       f"{ratios[0]:.2f}-{ratios[-1]:.2f}x torch's speed on the same cores; "
                       f"the check {checks[0]:.1f}-{checks[-1]:.1f}% of the job's CPU")
    except (KeyError, TypeError, IndexError, ValueError):
        pass
    return out


HEADLINES = "Headline ratios"


def hand_written(text: str) -> tuple[dict[str, list[str]], list[str]]:
    """What no script generates in an existing benchmarks.md, to keep across re-renders:
    ``### `` subsections at the end of a generated section (by section name), and whole
    ``## `` sections under other names (in order). Everything else is re-rendered."""
    subsections: dict[str, list[str]] = {}
    others: list[str] = []
    section, keep = None, None
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
            generated = section in BENCHES or section == HEADLINES
            keep = None if generated else others
            if keep is not None:
                keep.append(line)
            continue
        if line.startswith("### ") and section in BENCHES:
            keep = subsections.setdefault(section, [])
        if keep is not None:
            keep.append(line)
    return subsections, others


def _machine(r: dict) -> str:
    """Where ``r`` ran (results saved before machines were recorded: this one)."""
    return r.get("machine") or machine()


def _machines(results: list[dict]) -> str:
    names = sorted({_machine(r) for r in results})
    if len(names) == 1:
        return f"Machine: {names[0]}."
    return ("Sections were measured on different machines (each caption names its own): "
            + "; ".join(names) + ".")


def write(results: list[dict], out: Path, quick: bool) -> Path:
    img = out / "img"
    img.mkdir(parents=True, exist_ok=True)
    path = out / "benchmarks.md"
    kept, extra = hand_written(path.read_text()) if path.exists() else ({}, [])
    lines = ["# Benchmarks", "",
             "Generated by `python bench/run_all.py" + (" --quick" if quick else "") + "` "
             "(`make bench`); edit by hand only `###` subsections at the end of a section "
             "and sections under other names (re-renders keep those). "
             + _machines(results), "",
             "The machine was shared with other work while these ran (its 1-minute load is "
             "given per script): compare figures side by side within one run, quote ratios "
             "and medians, not absolute single numbers.", ""]
    heads = headlines(results)
    if heads:
        lines += [f"## {HEADLINES}", ""] + [f"- {h}" for h in heads] + [""]
    for r in results:
        lines += [f"## {r['name']}", "", BENCHES[r["name"]][3] + ".", "",
                  f"Measured {r['date']} with `{r['command']}` in {r['seconds']} s "
                  f"(load {r['load_1m']:.1f}).", ""]
        if r["data"] is None:
            lines += [f"Not measured: {r['error']}", ""] + kept.get(r["name"], [])
            continue
        try:
            md, plots = render(r, img)
        except (KeyError, TypeError, ValueError) as exc:
            md, plots = f"Could not tabulate ({exc}):\n\n```\n{json.dumps(r['data'])[:3000]}\n```", []
        lines += [md, ""]
        for png, caption in plots:
            lines += [f"![{caption}](img/{png})", "",
                      f"*{caption}: `{r['command']}`, {r['date']}, {_machine(r)}.*", ""]
        lines += kept.get(r["name"], [])
    lines += extra
    path.write_text("\n".join(lines).rstrip("\n") + "\n")
    return path


def merged(path: Path, fresh: list[dict], quick: bool) -> list[dict]:
    """``fresh`` results in place of the same scripts' in the saved run at ``path`` (same
    ``--quick``), the others kept: ``--only runtime`` re-measures one section, not the page."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return fresh
    if saved.get("quick") != quick:
        return fresh
    by_name = {r["name"]: r for r in fresh}
    out = [by_name.pop(r["name"], r) for r in saved.get("results", [])]
    return out + list(by_name.values())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes (minutes, not an hour)")
    p.add_argument("--only", nargs="+", choices=list(BENCHES), default=list(BENCHES))
    p.add_argument("--out", type=Path, default=ROOT / "docs")
    p.add_argument("--from-json", type=Path, metavar="FILE",
                   help="re-render a previous run's benchmarks.json instead of running")
    args = p.parse_args(argv)
    if importlib.util.find_spec("matplotlib") is None:  # found out after an hour of benches
        print("bench/run_all.py draws its plots with matplotlib, which is not installed: "
              "run `make bench`, or `pip install -e '.[bench]'` first", file=sys.stderr)
        return 2
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        print(write(saved["results"], args.out, saved["quick"]))
        return 0
    results = []
    for name in args.only:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        results.append(run(name, args.quick))
        r = results[-1]
        print(f"  {name}: {'ok' if r['data'] is not None else r['error']} "
              f"({r['seconds']} s)", file=sys.stderr, flush=True)
    results = merged(args.out / "benchmarks.json", results, args.quick)
    (args.out / "benchmarks.json").write_text(json.dumps({"quick": args.quick,
                                                          "results": results}, indent=1))
    print(write(results, args.out, args.quick))
    return 0 if all(r["data"] is not None for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
