"""Data-parallel training, every gradient checked: samples/s of swarm.local(2) against the
local numpy loop (and torch, from its own venv, where there is one), side by side in one run.

    python bench/train.py [--json] [--quick] [--steps 40] [--runs 3] [--batch 64]
                          [--torch-python .venv-st/bin/python] [--epochs 10]

Rows, for ``mlp:784-128-10`` and ``mlp:784-1024-1024-10`` on MNIST 5k (``--batch`` samples a
step, SGD with momentum):

- ``numpy``: :func:`swarm.training.local_compute` in this process (BLAS on every core), the
  reference a swarm run must equal; ``numpy 1 thread``: the same on one BLAS thread (what
  each worker gets);
- ``swarm``: ``client.train`` on ``swarm.local(2, threads=1)``: each step's four blocks on
  the two worker processes, every product of every block checked here before its gradient
  counts;
- ``torch``: the same model and optimiser in torch (2 threads), from ``--torch-python`` (a
  venv of its own, never the project's: ``make .venv-st/.installed``, with ``TORCH=`` naming a
  CPU build), when that interpreter exists.

Each figure: samples/s over ``--steps`` steps, the median of ``--runs`` runs, the systems
taking turns within each run. ``check %``: the CPU the trainer spent on the checks (a step's
check vectors and weight fingerprints, made in its SGD update; each product's Freivalds
check: thread time, every part on the thread that ran it, no helper threads and no BLAS, whose
pool spins on after a call) over the CPU of the whole swarm job (the requester process and
both workers, from /proc); ``replay %``: the trainer's own
non-linear steps in the same replays (which it needs for the loss and the bias gradients
anyway), over the same. ``--epochs N`` (not in --quick) also trains
mlp:784-128-10 for N epochs on the swarm and reports its test accuracy (the issue's 10-epoch
run).
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

MODELS = ("mlp:784-128-10", "mlp:784-1024-1024-10")

TORCH = r"""
import json, sys, time
import numpy as np
import torch
torch.set_num_threads(2)
print(json.dumps({"torch": torch.__version__}), flush=True)
for line in sys.stdin:
    sizes, batch, steps, lr, momentum = json.loads(line)
    layers = []
    for i, o in zip(sizes, sizes[1:]):
        layers += [torch.nn.Linear(i, o), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    x = torch.rand(batch * steps, sizes[0])
    y = torch.randint(0, sizes[-1], (batch * steps,))
    t = time.perf_counter()
    for s in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[s * batch:(s + 1) * batch]),
                                                 y[s * batch:(s + 1) * batch])
        loss.backward()
        opt.step()
    print(json.dumps(time.perf_counter() - t), flush=True)
"""


class Torch:
    """torch in its own venv, kept running: one timed run per request."""

    def __init__(self, python: str) -> None:
        self.proc = None
        self.version = f"not run: {python} missing (a venv with torch; never the project's)"
        if Path(python).exists():
            self.proc = subprocess.Popen([python, "-c", TORCH], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True)
            self.version = json.loads(self.proc.stdout.readline())["torch"]

    def seconds(self, sizes, batch: int, steps: int) -> float | None:
        if self.proc is None:
            return None
        self.proc.stdin.write(json.dumps([list(sizes), batch, steps, 0.05, 0.9]) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait(10)


def cpu_of(pids: list[int]) -> float:
    """User + system CPU seconds of processes (from /proc), this one by os.times."""
    total = sum(os.times()[:2])
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--quick", action="store_true", help="fewer steps and runs")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--epochs", type=int, default=10,
                   help="a full run of mlp:784-128-10 on the swarm (0: none)")
    p.add_argument("--torch-python", default=str(ROOT / ".venv-st" / "bin" / "python"))
    args = p.parse_args()
    if args.quick:
        args.steps, args.runs, args.epochs = 12, 1, 0

    import numpy as np
    from threadpoolctl import ThreadpoolController

    import swarm
    from models import mlp
    from models.data import load_mnist
    from swarm.training import SwarmCompute, TrainConfig, Trainer, local_compute, train

    blas = ThreadpoolController()
    data = load_mnist()
    torch = Torch(args.torch_python)
    rows: dict[str, dict[str, list[float]]] = {m: {} for m in MODELS}
    accuracy = None
    with swarm.local(2, threads=1) as client:
        pids = [pr.pid for pr in client.processes]
        for run in range(args.runs + 1):   # run 0 warms up
            for model in MODELS:
                cfg = TrainConfig(model=model, epochs=1, batch=args.batch, seed=run)
                n = args.steps * args.batch
                sub = type(data)(data.x[:n], data.y[:n], data.x_test[:10], data.y_test[:10],
                                 data.name)
                got = rows[model]

                def timed(compute, trainer, n=n):
                    t = time.perf_counter()
                    train(trainer, compute)
                    return n / (time.perf_counter() - t)

                local = Trainer(cfg, sub)
                speed = timed(local_compute(local.sizes), local)
                if run:
                    got.setdefault("numpy", []).append(speed)
                one = Trainer(cfg, sub)
                with blas.limit(limits=1, user_api="blas"):
                    speed = timed(local_compute(one.sizes), one)
                if run:
                    got.setdefault("numpy 1 thread", []).append(speed)
                remote = Trainer(cfg, sub)
                compute = SwarmCompute(client, remote.sizes)
                cpu0 = cpu_of(pids)
                speed = timed(compute, remote)
                cpu = cpu_of(pids) - cpu0
                if run:
                    got.setdefault("swarm", []).append(speed)
                    got.setdefault("check %", []).append(100 * compute.check_seconds / cpu)
                    got.setdefault("replay %", []).append(100 * compute.replay_seconds / cpu)
                    same = np.abs(np.array(remote.losses) - local.losses) / local.losses
                    got.setdefault("max rel. loss diff", []).append(float(same.max()))
                t = torch.seconds(mlp.parse_spec(model), args.batch, args.steps)
                if run and t is not None:
                    got.setdefault("torch", []).append(n / t)
        if args.epochs:
            job = client.train(data, model=MODELS[0], epochs=args.epochs, batch=args.batch,
                               lr=0.05, momentum=0.9, seed=0)
            result = job.result()
            accuracy = {"epochs": args.epochs, "test_accuracy": result.test_accuracy,
                        "seconds": round(result.seconds, 1), "rejected": result.rejected}
    torch.close()
    table = {m: {k: statistics.median(v) for k, v in cols.items()} for m, cols in rows.items()}
    out = {"batch": args.batch, "steps": args.steps, "runs": args.runs,
           "torch": torch.version, "load_1m": os.getloadavg()[0], "rows": table,
           "full_run": accuracy}
    if args.json:
        print(json.dumps(out))
        return 0
    cols = ["numpy", "numpy 1 thread", "swarm", "torch", "check %", "replay %",
            "max rel. loss diff"]
    print(f"samples/s, batch {args.batch}, {args.steps} steps, median of {args.runs} "
          f"(torch: {torch.version}; load {out['load_1m']:.1f})")
    print(f"{'model':22}" + "".join(f"{c:>20}" for c in cols))
    for model, r in table.items():
        print(f"{model:22}" + "".join(
            f"{r[c]:>20.3g}" if c in r else f"{'-':>20}" for c in cols))
    if accuracy:
        print(f"{MODELS[0]}, {accuracy['epochs']} epochs on swarm.local(2): test accuracy "
              f"{accuracy['test_accuracy']:.4f} in {accuracy['seconds']} s "
              f"({accuracy['rejected']} gradients refused)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
