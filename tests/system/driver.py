"""A requester for the system tests and the soak: joins a swarm, runs seeded matmul jobs,
checks every result against numpy here and prints one JSON line per job (then a summary).

    python -m tests.system.driver URI --data-dir D [--jobs N | --until-file F] [--size S]
        [--batch K] [--seed X] [--min-workers N] [--report-liars]

``--report-liars`` attaches a control plane to the requester's node so wrong results caught
by Freivalds' check are reported to the coordinator (which blocks repeat offenders), as
``swarm demo`` does. Exit 0 when every job came back right, 1 otherwise."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("uri")
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--jobs", type=int, default=0, help="stop after this many (0: no limit)")
    p.add_argument("--until-file", type=Path, help="stop once this file exists")
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--batch", type=int, default=2, help="matmuls submitted together per job")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-workers", type=int, default=1)
    p.add_argument("--timeout", type=float, default=120.0, help="per job")
    p.add_argument("--report-liars", action="store_true")
    args = p.parse_args(argv)
    import logging
    import os

    logging.basicConfig(level=os.environ.get("SWARM_DRIVER_LOG", "WARNING"),
                        format="%(name)s %(levelname)s %(message)s")

    from swarm.api import connect
    from swarm.runtime.refs import get
    from swarm.uri import parse

    args.data_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    client = connect(args.uri, data_dir=args.data_dir, min_workers=args.min_workers,
                     timeout=60)
    control = None
    if args.report_liars:
        from swarm.commands.demo_run import _attach_control

        control = _attach_control(client, parse(args.uri))
        deadline = time.monotonic() + 30  # reports go to the coordinator: learn it first
        while (control.controller.coordinator is None and control.controller.state is None
               and time.monotonic() < deadline):
            time.sleep(0.1)
    totals = {"jobs": 0, "ok": 0, "wrong": 0, "lost": 0, "rejected": 0}
    try:
        i = 0
        while (not args.jobs or i < args.jobs) and not (args.until_file
                                                          and args.until_file.exists()):
            a = rng.standard_normal((args.size, args.size), dtype=np.float32)
            bs = [rng.standard_normal((args.size, args.size), dtype=np.float32)
                  for _ in range(args.batch)]
            t0 = time.monotonic()
            row: dict = {"job": i}
            try:
                outs = get([client.matmul.remote(a, b) for b in bs], timeout=args.timeout)
                wrong = sum(not np.allclose(o, a @ b, rtol=1e-3, atol=1e-2)
                            for o, b in zip(outs, bs, strict=True))
                row |= {"ok": wrong == 0, "wrong": wrong}
            except Exception as exc:  # noqa: BLE001 - a lost job is a result to report
                row |= {"ok": False, "lost": True, "error": f"{type(exc).__name__}: {exc}"}
            report = client.last_report
            peers = {k: {"verified": v.verified, "rejected": v.rejected, "failed": v.failed}
                     for k, v in (report.peers.items() if report else [])}
            row |= {"seconds": round(time.monotonic() - t0, 3), "peers": peers}
            totals["jobs"] += 1
            totals["ok"] += bool(row["ok"])
            totals["wrong"] += bool(row.get("wrong"))
            totals["lost"] += bool(row.get("lost"))
            totals["rejected"] += sum(v["rejected"] for v in peers.values())
            print(json.dumps(row), flush=True)
            i += 1
    finally:
        if control is not None:
            client._loop.run(control.close(), 10)
        client.close()
    print(json.dumps({"summary": totals}), flush=True)
    return 0 if totals["ok"] == totals["jobs"] else 1


if __name__ == "__main__":
    sys.exit(main())
