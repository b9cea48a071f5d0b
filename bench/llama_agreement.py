"""Top-1 agreement of the local forward with llama.cpp on the same GGUF file (issue 44: >= 97%
of >= 500 positions, each disagreement listed with llama.cpp's top-2 margin).

The same token sequences (varied texts and chat conversations rendered by the model's own
template, teacher-forced) go through llama.cpp, in its own venv (a subprocess: llama.cpp is a
reference, never a product dependency), and through models.llama's forward here. Per position
the table counts whether our top-1 token is llama.cpp's, and lists every disagreement with
llama.cpp's margin (its best logit minus its second) and ours (our best logit minus our logit
for llama.cpp's choice).

Three engines, so a disagreement can be told apart from a bug:

* ``llama.cpp`` on the file as shipped: every weight product quantizes its activations to 8
  bits (Q8_0/Q8_1/Q8_K blocks) and the KV cache is float16, so its own logits carry noise;
* ``llama.cpp f32`` (``--f32``): llama.cpp on the same weights dequantized to an F32 GGUF
  (written to a temporary directory) with an F32 KV cache: the same model without that
  rounding, which is what the local forward computes (float32 products of the dequantized
  weights);
* the local forward.

``llama.cpp vs llama.cpp f32`` is llama.cpp's agreement with itself across its own rounding:
the floor that any exact float32 forward can reach against the shipped run.

Measured (llama-cpp-python 0.3.36, 2 threads): SmolLM2-135M Q4_1, 807 positions: 779 agree
with llama.cpp as shipped (96.5%), 807 with llama.cpp f32, and llama.cpp f32 against
llama.cpp disagrees at the same 28 positions (each with llama.cpp's top-2 margin under 0.2).
Qwen2.5-Coder-0.5B Q4_K_M, 770 positions: 759 (98.6%), 770, and the same 11 positions.

    python bench/llama_agreement.py [--model smollm2|qwen2.5-0.5b|PATH] [--f32] [--json]
    SWARM_BENCH_LLAMA_PYTHON=/path/to/.venv-llama/bin/python python bench/llama_agreement.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
LLAMA_PYTHON = os.environ.get("SWARM_BENCH_LLAMA_PYTHON", ".venv-llama/bin/python")
TOP = 8

# Runs in the llama.cpp venv. stdin: {"model", "sequences", "top", "f32", "bench"}; stdout: JSON, per
# sequence the top ids and logits at every position.
LLAMA_SCRIPT = r"""
import json, sys, tempfile
from pathlib import Path
import numpy as np
import llama_cpp

job = json.load(sys.stdin)
model, top = job["model"], job["top"]
sys.path.insert(0, job["bench"])
from llama_reference import write_f32_gguf  # the dequantized F32 copy, one writer of it


def run(path, **kw):
    n = max(len(s) for s in job["sequences"])
    llm = llama_cpp.Llama(model_path=path, n_ctx=n, n_batch=n, n_ubatch=n, n_threads=2,
                          logits_all=True, verbose=False, **kw)
    out = []
    for ids in job["sequences"]:
        llm.reset()
        llm.eval(ids)
        scores = np.array(llm.scores[:len(ids)], dtype=np.float32)
        best = np.argsort(-scores, axis=1)[:, :top]
        out.append({"top_ids": best.tolist(),
                    "top_logits": np.take_along_axis(scores, best, 1).tolist()})
    del llm
    return out


result = {"llama_cpp_python": llama_cpp.__version__, "shipped": run(model)}
if job["f32"]:
    with tempfile.TemporaryDirectory() as tmp:
        f32 = str(Path(tmp) / "f32.gguf")
        write_f32_gguf(model, f32)
        result["f32"] = run(f32, type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
print(json.dumps(result))
"""

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"},
     {"role": "assistant", "content": "The capital of France is Paris."},
     {"role": "user", "content": "And what river runs through it?"},
     {"role": "assistant", "content": "The Seine runs through Paris, dividing it into the "
                                      "Left Bank and the Right Bank."}],
    [{"role": "system", "content": "You are a concise assistant who answers in one paragraph."},
     {"role": "user", "content": "Write a Python function that checks whether a string is a "
                                 "palindrome, ignoring case and spaces."},
     {"role": "assistant", "content": "def is_palindrome(s: str) -> bool:\n    t = ''.join("
                                      "s.lower().split())\n    return t == t[::-1]\n\nIt "
                                      "lowercases the text, drops the spaces and compares it "
                                      "with its reverse."}],
    [{"role": "user", "content": "Give me three tips for sleeping better."},
     {"role": "assistant", "content": "1. Go to bed and wake up at the same time every day.\n"
                                      "2. Keep your bedroom dark, quiet and cool.\n3. Avoid "
                                      "caffeine and large meals in the evening."}],
]


def sequences(tokenizer) -> list[tuple[str, list[int]]]:
    """(label, ids): the reference documents (prose, a chat, code, a recipe in two languages)
    and the conversations above, each through the model's own template and tokenizer."""
    sys.path.insert(0, str(ROOT / "bench"))
    from llama_reference import DOCUMENTS

    out = [(f"doc {i}", tokenizer.encode(t)) for i, t in enumerate(DOCUMENTS)]
    out += [(f"chat {i}", tokenizer.encode(tokenizer.render_chat(m, add_generation_prompt=False)))
            for i, m in enumerate(CHATS)]
    return out


def llama_top(model: str, seqs: list[list[int]], f32: bool) -> dict:
    py = ROOT / LLAMA_PYTHON if not os.path.isabs(LLAMA_PYTHON) else Path(LLAMA_PYTHON)
    if not py.exists():
        raise SystemExit(f"no llama.cpp venv at {py} (make bench creates it; or set "
                         "SWARM_BENCH_LLAMA_PYTHON)")
    with tempfile.TemporaryFile("w+") as job:
        json.dump({"model": model, "sequences": seqs, "top": TOP, "f32": f32,
                   "bench": str(ROOT / "bench")}, job)
        job.seek(0)
        res = subprocess.run([str(py), "-c", LLAMA_SCRIPT], stdin=job, capture_output=True,
                             text=True, timeout=1800)
    if res.returncode:
        raise SystemExit(f"llama.cpp failed: {res.stderr.strip()[-500:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def compare(labels, ours_top, ref: list[dict], tokenizer) -> dict:
    """Top-1 agreement of ``ours_top`` (per sequence: [positions, 2] ids and logits of our two
    best, plus our logit of each of ref's top ids) with ``ref``'s top-1."""
    rows, agree, total = [], 0, 0
    for label, ours, r in zip(labels, ours_top, ref, strict=True):
        ids, logits = np.array(r["top_ids"]), np.array(r["top_logits"])
        mine_ids, mine_best, mine_at_ref = ours
        same = mine_ids == ids[:, 0]
        agree += int(same.sum())
        total += len(ids)
        for pos in np.flatnonzero(~same):
            rank = np.flatnonzero(ids[pos] == mine_ids[pos])
            rows.append({"seq": label, "pos": int(pos),
                         "llama_top1": tokenizer.decode([int(ids[pos, 0])]),
                         "ours_top1": tokenizer.decode([int(mine_ids[pos])]),
                         "ours_rank_in_llama": int(rank[0]) + 1 if rank.size else None,
                         "llama_margin": round(float(logits[pos, 0] - logits[pos, 1]), 4),
                         "ours_margin": round(float(mine_best[pos] - mine_at_ref[pos]), 4)})
    return {"positions": total, "agree": agree, "pct": round(100 * agree / total, 2),
            "disagreements": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, metavar="PATH|NAME")
    ap.add_argument("--f32", action="store_true",
                    help="also run llama.cpp on the weights dequantized to F32 (a temporary "
                         "F32 GGUF: ~2 GB for Qwen2.5-0.5B)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from threadpoolctl import threadpool_limits

    from models import catalog, gguf_weights
    from models.llama import Llama
    from models.tokenizer_bpe import BPETokenizer

    path, name = catalog.resolve(args.model)
    weights = gguf_weights.load(path, name)
    tokenizer = BPETokenizer(weights.vocab)
    seqs = sequences(tokenizer)
    labels = [label for label, _ in seqs]
    t = time.perf_counter()
    ref = llama_top(str(path), [ids for _, ids in seqs], args.f32)
    llama_s = time.perf_counter() - t

    model = Llama(weights)
    t = time.perf_counter()
    ours: dict[str, list] = {k: [] for k in ref if k != "llama_cpp_python"}
    with threadpool_limits(1, user_api="blas"):
        for (_, ids), *refs in zip(seqs, *(ref[k] for k in ours), strict=True):
            lg = model.forward(ids, model.new_cache(len(ids)), all_logits=True)
            best = lg.argmax(1)
            for k, r in zip(ours, refs, strict=True):
                ref_top1 = np.array(r["top_ids"])[:, 0]
                ours[k].append((best, lg[np.arange(len(ids)), best],
                                lg[np.arange(len(ids)), ref_top1]))
    ours_s = time.perf_counter() - t

    results = {f"local vs llama.cpp{'' if k == 'shipped' else ' f32'}":
               compare(labels, ours[k], ref[k], tokenizer) for k in ours}
    if "f32" in ref:  # llama.cpp against itself: shipped (rounded activations) vs f32
        selfs = [(np.array(f["top_ids"])[:, 0], np.array(f["top_logits"])[:, 0],
                  _logit_of(f, np.array(s["top_ids"])[:, 0]))
                 for s, f in zip(ref["shipped"], ref["f32"], strict=True)]
        results["llama.cpp f32 vs llama.cpp"] = compare(labels, selfs, ref["shipped"], tokenizer)
    out = {"model": weights.name, "file": path.name, "llama_cpp_python": ref["llama_cpp_python"],
           "sequences": {label: len(ids) for label, ids in seqs},
           "seconds": {"llama.cpp": round(llama_s, 1), "local": round(ours_s, 1)},
           "load": os.getloadavg()[0], "results": results}
    if args.json:
        print(json.dumps(out, indent=1, ensure_ascii=False))
        return
    print_tables(out)


def _logit_of(r: dict, ids: np.ndarray) -> np.ndarray:
    """``r``'s logit of each position's token ``ids`` (-inf where it is not in r's top)."""
    top, logits = np.array(r["top_ids"]), np.array(r["top_logits"])
    hit = top == ids[:, None]
    return np.where(hit.any(1), (logits * hit).sum(1), -np.inf)


def print_tables(out: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=160)
    t = Table(title=f"top-1 agreement, {out['model']} ({out['file']}), llama.cpp "
                    f"{out['llama_cpp_python']}, load {out['load']:.2f}")
    for col in ("comparison", "positions", "agree", "%", "disagreements"):
        t.add_column(col)
    for name, r in out["results"].items():
        t.add_row(name, str(r["positions"]), str(r["agree"]), f"{r['pct']:.2f}",
                  str(len(r["disagreements"])))
    con.print(t)
    for name, r in out["results"].items():
        if not r["disagreements"]:
            continue
        t = Table(title=f"disagreements, {name} (margins: best logit minus second / minus the "
                        "other engine's choice)")
        for col in r["disagreements"][0]:
            t.add_column(col)
        for d in r["disagreements"]:
            t.add_row(*(repr(v) if isinstance(v, str) else str(v) for v in d.values()))
        con.print(t)
    con.print({"sequences": out["sequences"], "seconds": out["seconds"]})


if __name__ == "__main__":
    main()
