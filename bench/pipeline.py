"""Does pipelining pay? Total decode tok/s of concurrent sequences over verified spans.

    python bench/pipeline.py [--model PATH|NAME] [--sequences 16] [--decode 16] [--runs 3]

One ``swarm.local(2)`` (two worker processes, one thread each, every value checked), the same
sequences decoded greedily three ways, side by side in one run:

- one worker hosting every block (one span), all sequences in one batch;
- the two workers a span each, all sequences in one batch: a step visits the spans in turn,
  so one worker waits while the other computes;
- the two workers a span each, the sequences split into one lane per span
  (models.batching's lanes, each at its own step in its own thread): while one lane is on
  the second worker, the next is on the first.

Prints each row's total tok/s (median over ``--runs``), its ratio to the one-worker row, and
the most span calls that were out at once. On one machine the workers and the requester's
checks share its cores, so this shows what the lanes overlap, not what separate machines
would gain.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def decode_in_lanes(model, lanes: list[list[list[int]]], steps: int) -> float:
    """Seconds for ``steps`` greedy decode steps of every lane's sequences, each lane a batch
    stepping in its own thread (the prefill before the clock)."""
    from threadpoolctl import threadpool_limits

    ready = threading.Barrier(len(lanes) + 1)
    done = threading.Barrier(len(lanes) + 1)
    errors: list[BaseException] = []

    def lane(prompts: list[list[int]]) -> None:
        try:
            with threadpool_limits(1, user_api="blas"):
                caches = [model.new_cache(len(p) + steps + 1) for p in prompts]
                logits = model.forward_batch(list(zip(prompts, caches, strict=True)))
                ready.wait()
                for _ in range(steps):
                    nxt = [[int(np.argmax(lg))] for lg in logits]
                    logits = model.forward_batch(list(zip(nxt, caches, strict=True)))
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)
            ready.abort()
        finally:
            done.wait()

    threads = [threading.Thread(target=lane, args=(p,), daemon=True) for p in lanes]
    for t in threads:
        t.start()
    ready.wait()
    began = time.perf_counter()
    done.wait()
    took = time.perf_counter() - began
    if errors:
        raise errors[0]
    return took


def split(prompts: list[list[int]], n: int) -> list[list[list[int]]]:
    return [prompts[i::n] for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, metavar="PATH|NAME",
                    help="a .gguf file or a known model (default smollm2)")
    ap.add_argument("--sequences", type=int, default=16, help="concurrent sequences")
    ap.add_argument("--decode", type=int, default=16, help="decode steps timed")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import swarm
    from models import catalog, gguf_weights
    from models.tokenizer_bpe import BPETokenizer
    from swarm.placement import Offer
    from swarm.spans import SpanLlama

    path, name = catalog.resolve(args.model)
    weights = gguf_weights.load(path, name)
    tokenizer = BPETokenizer(weights.vocab)
    docs = json.loads((ROOT / "bench" / "llama_reference.json").read_text())["documents"]
    prompts = [tokenizer.encode(d["text"])[i:i + 16] for i in range(0, 64, 16)
               for d in docs][:args.sequences]
    rows = []
    with swarm.local(2, threads=1) as client:
        one = SpanLlama(client, weights, offers=[Offer(client.worker_ids[0], 1 << 40, 1.0)])
        two = SpanLlama(client, weights)
        configs = [("one worker, every block, one batch", one, 1),
                   ("two workers, a span each, one batch", two, 1),
                   (f"two workers, a span each, {two.lanes} lanes", two, two.lanes)]
        for _, model, lanes in configs:  # places the spans, sends the bundles once
            decode_in_lanes(model, split(prompts[:lanes], lanes), 1)
        times: dict[str, list[float]] = {label: [] for label, _, _ in configs}
        flights: dict[str, int] = {}
        for _ in range(args.runs):  # interleaved, so load drifts hit every row alike
            for label, model, lanes in configs:
                model.take_stats()
                times[label].append(decode_in_lanes(model, split(prompts, lanes),
                                                    args.decode))
                st = model.take_stats()
                flights[label] = max(flights.get(label, 0), st.most_in_flight)
                if st.rejected:
                    raise SystemExit(f"{label}: {st.rejected} span calls rejected")
    base = None
    for label, _, lanes in configs:
        s = statistics.median(times[label])
        tok_s = len(prompts) * args.decode / s
        base = base or tok_s
        rows.append({"setup": label, "lanes": lanes, "sequences": len(prompts),
                     "total_tok_s": round(tok_s, 1), "vs_one_worker": round(tok_s / base, 2),
                     "most_calls_at_once": flights[label]})
    if args.json:
        print(json.dumps({"model": weights.name, "rows": rows}, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"pipelining, {weights.name}, {args.decode} decode steps, "
                    f"median of {args.runs}")
    for col in rows[0]:
        t.add_column(col)
    for r in rows:
        t.add_row(*(str(v) for v in r.values()))
    Console().print(t)


if __name__ == "__main__":
    main()
