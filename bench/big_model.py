"""A model no single worker can hold, on workers that each hold a part: issue 46's demo.

    make qwen-1.5b-model     # once: the 1.1 GB Qwen2.5-Coder-1.5B file
    python bench/big_model.py [--model qwen2.5-1.5b] [--workers 3] [--max-memory 450M]
                              [--tokens 12] [--compare 32] [--json]

Starts `swarm publish --max-memory 1M --http ... --model MODEL` (it offers nothing, so it
hosts no span; it serves the chat API) and ``--workers`` `swarm join --max-memory M`
processes on loopback (none may hold the file: it is larger than M), then asks "What is the
capital of France?" as a user would: `swarm generate URI ... --model MODEL --json`, and
/v1/chat/completions of the publisher through the `openai` client. With ``--compare N``, a
requester in this process also decodes 5 prompts x N greedy tokens over the spans and the
same with the local forward, and counts the tokens that differ. Prints where each span of
blocks ran, the answers, and each worker's memory: its RSS once joined (its baseline), its
peak RSS over the whole run (VmHWM), and whether the peak stayed under M plus that
baseline, as the issue asks. Exits 1 when an answer lacks "Paris", a worker hosted nothing,
a peak went over, or a compared token differs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from swarm.commands.demo_run import SwarmProcess, child_env  # noqa: E402

QUESTION = "What is the capital of France?"
PROMPTS = ["What is the capital of France?", "Write a Python function that reverses a string.",
           "Explain what a hash table is in one sentence.", "List three prime numbers.",
           "Translate 'good morning' into Spanish."]


def wait_text(proc: SwarmProcess, text: str, timeout: float) -> str:
    """The first stderr line of ``proc`` containing ``text``."""
    deadline = time.monotonic() + timeout
    with proc.cond:
        while True:
            for line in proc.lines:
                if text in line:
                    return line
            if time.monotonic() > deadline or proc.popen.poll() is not None:
                raise RuntimeError(f"{proc.name}: no {text!r} line; stderr:\n"
                                   + "\n".join(proc.lines[-20:]))
            proc.cond.wait(0.2)


def compare(uri: str, path: Path, workers: int, tokens: int, data_dir: Path) -> dict:
    """5 prompts x ``tokens`` greedy tokens over the spans and with the local forward."""
    import numpy as np

    import swarm
    from models.generate import generator

    gen = generator(str(path))

    def greedy(model, ids: list[int]) -> list[int]:
        cache = model.new_cache(len(ids) + tokens + 1)
        logits = model.forward(ids, cache)
        out = []
        for _ in range(tokens):
            out.append(int(np.argmax(logits)))
            logits = model.forward([out[-1]], cache)
        return out

    prompts = [gen.chat_prompt([{"role": "user", "content": p}]) for p in PROMPTS]
    want = [greedy(gen.model, p) for p in prompts]
    data_dir.mkdir(parents=True, exist_ok=True)
    with swarm.connect(uri, min_workers=workers, data_dir=data_dir, timeout=120) as client:
        spans = client.span_model(str(path))
        got = [greedy(spans, p) for p in prompts]
        st = spans.take_stats()
    differ = sum(a != b for w, g in zip(want, got, strict=True)
                 for a, b in zip(w, g, strict=True))
    return {"prompts": len(prompts), "tokens_each": tokens, "tokens_differing": differ,
            "checked_calls": st.calls, "rejected": st.rejected}


def memory(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of ``pid`` in MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


def parse_size(text: str) -> int:
    from swarm.commands._common import memory_size

    return memory_size(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-1.5b", metavar="PATH|NAME")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--max-memory", default="450M")
    ap.add_argument("--tokens", type=int, default=12)
    ap.add_argument("--compare", type=int, default=0, metavar="N",
                    help="also compare 5 prompts x N greedy tokens with the local forward")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from models import catalog

    path, _ = catalog.resolve(args.model)
    limit = parse_size(args.max_memory) / 2**20
    root = Path(tempfile.mkdtemp(prefix="bench-big-"))
    env = child_env()
    procs: dict[str, SwarmProcess] = {}
    try:
        procs["pub"] = SwarmProcess("pub", ["publish", "--name", "big", "--owner-key",
                                            f"soft:{root / 'o.key'}", "--backend", "numpy",
                                            "--max-memory", "1M", "--http", "127.0.0.1:0",
                                            "--model", str(path)], root, env)
        uri = procs["pub"].first_stdout_line(120)
        url = wait_text(procs["pub"], "join from a browser: ", 120).split(
            "join from a browser: ", 1)[1].strip()
        for i in range(args.workers):
            procs[f"w{i}"] = SwarmProcess(f"w{i}", [
                "join", uri, "--yes", "--backend", "numpy", "--threads", "1",
                "--max-memory", args.max_memory], root, env)
        peers = {n: procs[n].wait_for("peer: ", 120).split()[1] for n in procs if n != "pub"}
        for n in peers:
            procs[n].wait_for("joined swarm", 120)
        baseline = {n: memory(procs[n].popen.pid)["VmRSS"] for n in peers}
        started = time.monotonic()
        gen = subprocess.run(
            [sys.executable, "-P", "-m", "swarm", "generate", uri, QUESTION, "--model",
             str(path), "--max-tokens", str(args.tokens), "--min-workers", str(args.workers),
             "--json", "--data-dir", str(root / "requester")],
            capture_output=True, text=True, env=env, timeout=3600)
        seconds = time.monotonic() - started
        if gen.returncode != 0:
            print(gen.stderr[-3000:], file=sys.stderr)
            return gen.returncode
        answer = json.loads(gen.stdout)
        import openai

        key = (root / "pub" / "api-key").read_text().strip()
        api = openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key=key, max_retries=0,
                            timeout=1800)
        chat = api.chat.completions.create(
            model=answer["model_id"], max_tokens=args.tokens, temperature=0,
            messages=[{"role": "user", "content": QUESTION}]).choices[0].message.content
        checked = compare(uri, path, args.workers, args.compare, root / "compare") \
            if args.compare else None
        mem = {n: memory(procs[n].popen.pid) for n in peers}
    finally:
        for p in procs.values():
            p.stop()
        for p in procs.values():
            try:
                p.popen.wait(30)
            except subprocess.TimeoutExpired:
                p.popen.kill()
        shutil.rmtree(root, ignore_errors=True)
    hosted: dict[str, list] = {n: [] for n in peers}
    names = {p: n for n, p in peers.items()}
    for s in answer["spans"]:  # a span on no worker named here counts under "?"
        hosted.setdefault(names.get(s["worker"], "?"), []).append(s["layers"])
    covered = sorted(b for spans in hosted.values() for a, z in spans for b in range(a, z + 1))
    rows = [{"worker": n, "blocks": " ".join(f"{a}-{b}" for a, b in hosted[n]) or "-",
             "baseline_MiB": round(baseline[n]), "peak_MiB": round(mem[n]["VmHWM"]),
             "rss_after_MiB": round(mem[n]["VmRSS"]),
             "limit_MiB": round(limit + baseline[n]),
             "under": mem[n]["VmHWM"] <= limit + baseline[n]} for n in peers]
    ok = "Paris" in answer["text"] and "Paris" in chat and all(r["under"] and r["blocks"] != "-" for r in rows) \
        and "?" not in hosted and covered == list(range(len(covered))) \
        and (checked is None or checked["tokens_differing"] == 0)
    out = {"model": answer["model"], "file_bytes": path.stat().st_size,
           "max_memory": args.max_memory, "answer": answer["text"], "chat_answer": chat,
           "compared": checked,
           "tokens": answer["usage"]["completion_tokens"], "seconds": round(seconds, 1),
           "checked_calls": answer["checked_calls"], "rejected": answer["rejected"],
           "spans": answer["spans"], "workers": rows, "ok": ok}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        from rich.console import Console
        from rich.table import Table

        con = Console()
        con.print(f"{out['model']} ({out['file_bytes'] / 2**30:.2f} GiB) on {args.workers} "
                  f"workers of --max-memory {args.max_memory}: {out['answer']!r} "
                  f"({out['tokens']} tokens in {out['seconds']} s, {out['checked_calls']} "
                  f"span calls checked, {out['rejected']} rejected)")
        con.print(f"/v1/chat/completions: {chat!r}")
        if checked:
            con.print(f"greedy tokens over the spans against the local forward: "
                      f"{checked['prompts']} prompts x {checked['tokens_each']}, "
                      f"{checked['tokens_differing']} differ")
        t = Table(title="each worker's memory (MiB)")
        for col in rows[0]:
            t.add_column(col)
        for r in rows:
            t.add_row(*(str(v) for v in r.values()))
        con.print(t)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
