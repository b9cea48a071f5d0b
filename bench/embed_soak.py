"""MiniLM on swarm.local(2): worker memory over many batches, and one copy of the weights.

    python bench/embed_soak.py [--batches 1000] [--json]

Prints each worker's RSS before any weight arrived, after the first batch (weights cached),
after a second embedder (``verify="none"``: the same weights, by content address) ran, and
every 100 batches after; the goal (issue 31): flat over 1,000 batches, and the second
embedder adding no copy of the 42 MB of weights.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, default=1000)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    import psutil

    import swarm

    texts = ["a short sentence about the swarm", "hello world", "Verified embeddings.",
             "MiniLM on volunteer machines"]
    with swarm.local(2, threads=1) as client:
        procs = [psutil.Process(w.pid) for w in client.processes]

        def rss() -> list[float]:
            return [round(pr.memory_info().rss / 2**20, 1) for pr in procs]

        samples = {"start": rss()}
        verified = client.embedder()
        verified.run(texts)
        samples["after first batch"] = rss()
        client.embedder(verify="none").run(texts)
        samples["after a second embedder"] = rss()
        for i in range(1, args.batches + 1):
            verified.run(texts)
            if i % 100 == 0:
                samples[f"batch {i}"] = rss()
                if not args.json:
                    print(i, samples[f"batch {i}"], file=sys.stderr)
        first = samples["batch 100"] if args.batches >= 100 else samples["after first batch"]
        last = list(samples.values())[-1]
        out = {"rss_mib": samples, "growth_mib_after_batch_100": [
            round(b - a, 1) for a, b in zip(first, last, strict=True)],
            "second_embedder_mib": [round(b - a, 1) for a, b in zip(
                samples["after first batch"], samples["after a second embedder"], strict=True)]}
    print(json.dumps(out, indent=None if args.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
