"""A chat model's generation speed (SmolLM2-135M by default; --model PATH.gguf or a known name
such as qwen2.5-0.5b): prefill and decode tokens/s for llama.cpp (2 threads, its
own venv) and the local numpy forward, side by side in one run, plus what decides how the
model spreads over a swarm: one layer's weight products at batch 1 and 16, the check of a
product against a precomputed fingerprint, and the bytes a token's activations carry.

    python bench/generate.py [--model smollm2] [--prompt 128] [--decode 32] [--runs 3] [--json]
    SWARM_BENCH_LLAMA_PYTHON=.venv-llama/bin/python python bench/generate.py

llama.cpp comes from .venv-llama (``make bench`` creates it; llama-cpp-python compiles from
source); without it that row says so. Each figure is the median of ``--runs``; the two
engines alternate run by run.
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

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
LLAMA_PYTHON = os.environ.get("SWARM_BENCH_LLAMA_PYTHON", ".venv-llama/bin/python")

# Runs in the llama.cpp venv: greedy, the same prompt ids; prints JSON.
LLAMA_SCRIPT = r"""
import json, sys, time
import llama_cpp
model, ids, n_decode = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
threads = int(sys.argv[4])
llm = llama_cpp.Llama(model_path=model, n_ctx=1024, n_batch=512, n_threads=threads,
                      n_threads_batch=threads, verbose=False)
llm.reset(); llm.eval(ids[:8])  # warm up
llm.reset()
t = time.perf_counter(); llm.eval(ids); prefill = time.perf_counter() - t
steps = []
for _ in range(n_decode):
    tok = int(llm.scores[llm.n_tokens - 1].argmax())
    t = time.perf_counter(); llm.eval([tok]); steps.append(time.perf_counter() - t)
print(json.dumps({"prefill_s": prefill, "decode_s": sorted(steps)[len(steps) // 2]}))
"""


def prompt_ids(tokenizer, n: int) -> list[int]:
    text = json.loads((ROOT / "bench" / "llama_reference.json").read_text())["documents"][0]
    ids = tokenizer.encode(text["text"] * (1 + n // 100))
    return ids[:n]


def numpy_run(model, ids: list[int], n_decode: int, threads: int) -> dict:
    """The local forward on ``threads`` threads: BLAS (prefill tiles) and the quantized
    kernels' split (decode) both capped."""
    from threadpoolctl import threadpool_limits

    from models.quant import limit_threads

    cache = model.new_cache(len(ids) + n_decode)
    with threadpool_limits(threads, user_api="blas"), limit_threads(threads):
        t = time.perf_counter()
        logits = model.forward(ids, cache)
        prefill = time.perf_counter() - t
    steps = []
    with threadpool_limits(threads, user_api="blas"), limit_threads(threads):
        for _ in range(n_decode):
            t = time.perf_counter()
            logits = model.forward([int(np.argmax(logits))], cache)
            steps.append(time.perf_counter() - t)
    return {"prefill_s": prefill, "decode_s": statistics.median(steps)}


def batch_run(model, prompts: list[list[int]], n_decode: int) -> dict:
    """Concurrent sequences decoded together (models.llama.forward_batch), one BLAS thread:
    total tokens/s over the batch."""
    from threadpoolctl import threadpool_limits

    caches = [model.new_cache(len(p) + n_decode) for p in prompts]
    with threadpool_limits(1, user_api="blas"):
        logits = model.forward_batch(list(zip(prompts, caches, strict=True)))
        if hasattr(model, "take_stats"):  # a SpanLlama's split covers the decode steps only
            model.take_stats()
        steps = []
        for _ in range(n_decode):
            nxt = [[int(np.argmax(lg))] for lg in logits]
            t = time.perf_counter()
            logits = model.forward_batch(list(zip(nxt, caches, strict=True)))
            steps.append(time.perf_counter() - t)
    return {"decode_s": statistics.median(steps)}


def llama_run(model_path: str, ids: list[int], n_decode: int, threads: int) -> dict | str:
    py = ROOT / LLAMA_PYTHON if not os.path.isabs(LLAMA_PYTHON) else Path(LLAMA_PYTHON)
    if not py.exists():
        return f"no llama.cpp venv at {LLAMA_PYTHON} (make bench creates it)"
    res = subprocess.run([str(py), "-c", LLAMA_SCRIPT, model_path, json.dumps(ids),
                          str(n_decode), str(threads)], capture_output=True, text=True, timeout=600)
    if res.returncode:
        return f"llama.cpp failed: {res.stderr.strip()[-300:]}"
    return json.loads(res.stdout.strip().splitlines()[-1])


def layer_products(weights, runs: int) -> list[dict]:
    """Block 0's seven weight products at batch 1 and 16 by the quantized kernels
    (models.quant, kept as the file stores them; their default threads, BLAS on one for the
    tiles), the bytes read per second at batch 1, and the fingerprint check: with
    s = W.T r precomputed once per weight (from its dequantized rows), y = x W.T is checked
    as y r == x s, O(k + n) work per row instead of O(k n)."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    rows = []
    with threadpool_limits(1, user_api="blas"):
        for part in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                     "ffn_down"):
            w = weights.matrices[f"blk.0.{part}.weight"]
            r = rng.standard_normal((w.shape[0], 1)).astype(np.float32)
            s = w.check_vectors(r)[0][:, 0]
            r = r[:, 0]
            row = {"product": part, "type": w.qtype.name, "shape": f"{w.shape[1]}x{w.shape[0]}"}
            for m in (1, 16):
                x = rng.standard_normal((m, w.shape[1])).astype(np.float32)
                times, checks = [], []
                for _ in range(max(20, runs * 10)):
                    t = time.perf_counter()
                    y = w.matmul(x)
                    times.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    ok = np.abs(y @ r - x @ s).max() <= 1e-2 * (1 + np.abs(y @ r).max())
                    checks.append(time.perf_counter() - t)
                    assert ok
                row[f"b{m}_us"] = round(statistics.median(times) * 1e6, 1)
                row[f"b{m}_check_us"] = round(statistics.median(checks) * 1e6, 1)
                if m == 1:
                    row["b1_GB_s"] = round(w.nbytes / statistics.median(times) / 1e9, 1)
            rows.append(row)
    return rows


class _Free:
    """An executor that answers instantly (zeros): what is left of a decode step is the
    requester's own work (norms, RoPE, attention over the cache, SwiGLU, sampling aside)."""

    def prepare(self, weights) -> None:
        return None

    def matmuls(self, products):
        return [np.zeros((p.x.shape[0], p.w.shape[1]), np.float32) for p in products]


def requester_share(weights, ids: list[int], n_decode: int) -> float:
    from threadpoolctl import threadpool_limits

    from models.llama import Llama

    model = Llama(weights, _Free())
    cache = model.new_cache(len(ids) + n_decode)
    model.forward(ids, cache)
    steps = []
    with threadpool_limits(1, user_api="blas"):
        for _ in range(n_decode):
            t = time.perf_counter()
            model.forward([1], cache)
            steps.append(time.perf_counter() - t)
    return round(statistics.median(steps) * 1e3, 2)


def swarm_rows(weights, prompts: list[list[int]], n_decode: int, runs: int) -> list[dict]:
    """Verified decode through ``swarm.local(2)`` (swarm.spans: a span of 15 blocks on each
    worker, every value checked), batch 1 and ``len(prompts)``, with the ms per token split
    into compute (the workers'), links (round trips less that), checks (the requester's
    re-run of the non-linear steps and the fingerprint checks) and the rest (embedding, head,
    sampling), beside the local numpy forward's batch 1 in the same run."""
    import swarm
    from models.llama import Llama
    from swarm.spans import SpanLlama

    local = Llama(weights)
    out = []
    with swarm.local(2, threads=1) as client:
        model = SpanLlama(client, weights)
        batch_run(model, prompts[:1], 2)  # places the spans, sends the bundles once
        for label, batch in (("batch 1", prompts[:1]), (f"batch {len(prompts)}", prompts)):
            steps, parts = [], []
            for _ in range(runs):
                model.take_stats()
                steps.append(batch_run(model, batch, n_decode)["decode_s"])
                parts.append(model.take_stats())
            base = statistics.median(batch_run(local, batch, n_decode)["decode_s"]
                                     for _ in range(runs))
            dec = statistics.median(steps)
            st = parts[len(parts) // 2]
            per = 1e3 / n_decode  # batch_run drops the prefill's stats
            out.append({"engine": f"swarm.local(2) spans, verified, {label}",
                        "decode_tok_s": round(len(batch) / dec, 1),
                        "decode_ms_per_token": round(dec * 1e3 / len(batch), 2),
                        "step_ms": round(dec * 1e3, 1),
                        "compute_ms": round(st.worker * per, 1),
                        "links_ms": round((st.remote - st.worker) * per, 1),
                        "checks_ms": round(st.checks * per, 1),
                        "local_same_run_tok_s": round(len(batch) / base, 1),
                        "vs_local": round(base / dec, 2),
                        "note": f"rejected {st.rejected}"})
        memory = [_memory(p.pid) for p in client.processes]
        bundles = [round(b.future().result().nbytes / 2**20, 1) for b in model._bundles]
    for row in out:
        row["worker_rss_MiB"] = ", ".join(f"{m['VmRSS']:.0f} (peak {m['VmHWM']:.0f})"
                                          for m in memory)
        row["span_bundles_MiB"] = ", ".join(map(str, bundles))
    return out


def _memory(pid: int) -> dict[str, float]:
    """A process's resident memory now and at its peak (MiB, from /proc)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) / 1024
    return out


def swarm_tokens(weights, prompts: list[list[int]], n: int) -> dict:
    """Greedy tokens through ``swarm.local(2)`` spans (verified) against the local numpy
    forward's, ``n`` tokens for each prompt (issue 32: 5 prompts x 64)."""
    import swarm
    from models.llama import Llama
    from swarm.spans import SpanLlama

    def greedy(model, ids: list[int]) -> list[int]:
        cache, out = model.new_cache(len(ids) + n), []
        logits = model.forward(ids, cache)
        for _ in range(n):
            out.append(int(np.argmax(logits)))
            logits = model.forward([out[-1]], cache)
        return out

    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, user_api="blas"):
        want = [greedy(Llama(weights), p) for p in prompts]
        with swarm.local(2, threads=1) as client:
            model = SpanLlama(client, weights)
            got = [greedy(model, p) for p in prompts]
            st = model.take_stats()
    same = sum(a == b for a, b in zip(got, want, strict=True))
    return {"prompts": len(prompts), "tokens_each": n, "sequences_equal": same,
            "tokens_equal": sum(x == y for a, b in zip(got, want, strict=True)
                                for x, y in zip(a, b, strict=True)),
            "span_calls": st.calls, "rejected": st.rejected}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, metavar="PATH|NAME",
                    help="a .gguf file or a known model (default smollm2; qwen2.5-0.5b after "
                         "make qwen-model)")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens (prefill)")
    ap.add_argument("--decode", type=int, default=32, help="tokens decoded (greedy)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16, help="concurrent sequences (<= 16)")
    ap.add_argument("--swarm-tokens", type=int, default=0, metavar="N",
                    help="also compare N greedy tokens for 5 prompts through swarm.local(2) "
                         "spans with the local forward (issue 32 asks for 64)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from models import catalog, gguf_weights
    from models.llama import Llama
    from models.tokenizer_bpe import BPETokenizer

    path, name = catalog.resolve(args.model)
    weights = gguf_weights.load(path, name)
    model = Llama(weights)
    tokenizer = BPETokenizer(weights.vocab)
    ids = prompt_ids(tokenizer, args.prompt)
    results: dict[str, list] = {"numpy": [], "numpy 1 thread": [], "llama.cpp": [],
                                "llama.cpp 1 thread": []}
    error = None
    numpy_run(model, ids[:8], 2, 2)  # warm up (pages the weights in)
    for _ in range(args.runs):
        results["numpy"].append(numpy_run(model, ids, args.decode, 2))
        results["numpy 1 thread"].append(numpy_run(model, ids, args.decode, 1))
        for name, threads in (("llama.cpp", 2), ("llama.cpp 1 thread", 1)):
            got = llama_run(str(path), ids, args.decode, threads)
            if isinstance(got, str):
                error = got
            else:
                results[name].append(got)
    rows = []
    for engine, runs in results.items():
        if not runs:
            rows.append({"engine": engine, "note": error})
            continue
        pre = statistics.median(r["prefill_s"] for r in runs)
        dec = statistics.median(r["decode_s"] for r in runs)
        rows.append({"engine": engine, "prefill_tok_s": round(len(ids) / pre, 1),
                     "decode_tok_s": round(1 / dec, 1), "decode_ms_per_token": round(dec * 1e3, 2)})
    base = next((r for r in rows if r["engine"] == "llama.cpp" and "decode_tok_s" in r), None)
    for r in rows:
        if base and "decode_tok_s" in r:
            r["decode_vs_llama_cpp"] = round(r["decode_tok_s"] / base["decode_tok_s"], 2)
            r["prefill_vs_llama_cpp"] = round(r["prefill_tok_s"] / base["prefill_tok_s"], 2)
    docs = json.loads((ROOT / "bench" / "llama_reference.json").read_text())["documents"]
    prompts = [tokenizer.encode(d["text"])[i:i + 16] for i in range(0, 64, 16)
               for d in docs][:args.batch]
    single = [batch_run(model, prompts[:1], args.decode // 2) for _ in range(args.runs)]
    many = [batch_run(model, prompts, args.decode // 2) for _ in range(args.runs)]
    one_s = statistics.median(r["decode_s"] for r in single)
    many_s = statistics.median(r["decode_s"] for r in many)
    rows.append({"engine": f"numpy 1 thread, {len(prompts)} sequences together",
                 "decode_tok_s": round(len(prompts) / many_s, 1),
                 "decode_ms_per_token": round(many_s * 1e3, 2),
                 "note": f"a step for all; batch 1 in the same run: {1 / one_s:.1f} tok/s, "
                         f"{len(prompts) / many_s * one_s:.1f}x"})
    rows += swarm_rows(weights, prompts, args.decode // 2, args.runs)
    layers = layer_products(weights, args.runs)
    requester_ms = requester_share(weights, ids, args.decode)
    c = weights.config
    meta = {"prompt_tokens": len(ids), "decode_tokens": args.decode, "runs": args.runs,
            "threads": "numpy and llama.cpp: 2 threads, and 1 (models.generate decodes on 1)",
            "activation_bytes_per_token_per_layer_boundary": c.d_model * 4,
            "sharded_products_bytes_per_token_per_layer": 4 * (
                3 * c.d_model + c.d_model + 2 * c.n_kv_heads * c.head_dim  # q,k,v in/out
                + 2 * c.d_model  # attn_output in/out
                + c.d_model + 2 * c.d_ff  # gate, up in/out
                + c.d_ff + c.d_model),  # down in/out
            "weight_products_per_token": 7 * c.n_layers + 1,
            "dependent_executor_calls_per_token": 4 * c.n_layers + 1,
            "non_matmul_ms_per_decode_token": requester_ms}
    if args.swarm_tokens:
        meta["swarm_tokens"] = swarm_tokens(weights, prompts[:5], args.swarm_tokens)
    out = {"rows": rows, "layers": layers, "meta": meta}
    if args.json:
        print(json.dumps(out, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    con = Console()
    for title, recs in ((f"generation, {weights.name}", rows), ("layer 0 products", layers)):
        t = Table(title=title)
        cols = list(dict.fromkeys(k for r in recs for k in r))
        for col in cols:
            t.add_column(col)
        for r in recs:
            t.add_row(*(str(r.get(col, "")) for col in cols))
        con.print(t)
    con.print(meta)


if __name__ == "__main__":
    main()
