"""`swarm generate`: stream a chat model's reply to a prompt, token by token."""

from __future__ import annotations

import argparse
import sys

from swarm.commands._common import add_json_option, print_json

HELP = "stream a chat model's reply to a prompt as it is generated"
DESCRIPTION = """\
Joins the swarm named by URI as a requester and streams a chat model's reply to PROMPT on
stdout as it is decoded: --model names a GGUF file of the Llama or Qwen2 architecture, or a
known model (smollm2, the default: SmolLM2-135M-Instruct; qwen2.5-0.5b once `make
qwen-model` has assembled it). The prompt is the user's message in the model's chat
template (--raw: plain text to continue). Greedy by default; --temperature above 0 samples
(--top-p, --seed: the same seed gives the same text). Generation stops at the end of the
model's turn, at a --stop string, or after --max-tokens.

  swarm generate 'magnet:?xs=urn:btpk:...' "What is the capital of France?"
  swarm generate URI "Write a haiku" --temperature 0.8 --seed 7 --max-tokens 64 --json
  swarm generate URI "Hi" --model ~/models/qwen2.5-0.5b-instruct-q4_k_m.gguf

The model's blocks run on the swarm's workers, a span of consecutive blocks on each (their
weights go once; each token's activations travel), and every value a worker returns is
checked here before it is used: this machine re-runs each span's non-linear steps and checks
each weight product against a secret fingerprint (SECURITY.md, "Spans of layers"). A worker
that lies is reported with the proof and replaced; one that leaves is replaced and its cache
rebuilt. The embedding and the output head run here. With --min-workers 0 and no worker in
the swarm, the whole forward runs here. Exit status: 0 done, 1 the swarm could not be
reached (or no worker came), 2 a bad request (empty prompt, a prompt over the context,
--max-tokens out of range, a bad --temperature or --top-p, a --model file that is not a GGUF,
is truncated, or whose architecture, tensor types, tokenizer or chat template this code cannot
run), 4 the model is not installed.
"""


def configure(p: argparse.ArgumentParser) -> None:
    from swarm.commands._network import add_network_options

    add_network_options(p)
    p.add_argument("uri", metavar="URI", help="join URI (magnet:?xs=...) or HOST:PORT bootstrap")
    p.add_argument("prompt", metavar="PROMPT", help="the user's message (or text, with --raw)")
    p.add_argument("--model", metavar="PATH|NAME", default=None,
                   help="a .gguf file (llama or qwen2 architecture) or a known model: "
                   "smollm2 (default), qwen2.5-0.5b")
    p.add_argument("--max-tokens", type=int, default=256, metavar="N",
                   help="generate at most N tokens (default 256)")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T",
                   help="0 (default) picks the likeliest token; up to 2 samples more freely")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P",
                   help="sample only from the likeliest tokens whose mass reaches P")
    p.add_argument("--seed", type=int, default=None, help="seed for sampling")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop before TEXT (repeatable)")
    p.add_argument("--raw", action="store_true", help="continue PROMPT as plain text, "
                   "without the chat template")
    p.add_argument("--swarm", metavar="ID", help="swarm id (40 hex) when URI is HOST:PORT")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="give up joining after S seconds (default 60)")
    p.add_argument("--min-workers", type=int, default=1, metavar="N",
                   help="wait for N workers before starting (0: run the forward here if none)")
    add_json_option(p, "the text, finish reason, token counts, speed and where each span ran")


def run(args: argparse.Namespace) -> int:
    import time

    from models.generate import GenerationError, Usage, generator
    from models.tokenizer_bpe import ChatError
    from swarm.commands.submit import connect
    from swarm.errors import ConfigError

    if args.timeout <= 0:
        raise ConfigError("--timeout must be > 0 seconds")
    if not args.prompt:
        raise ConfigError("the prompt is empty: give some text to continue")
    if args.min_workers < 0:
        raise ConfigError("--min-workers must be >= 0")
    from models.gguf_file import ModelMissing, WeightsError
    from swarm.errors import LocalError, SwarmError
    from swarm.placement import PlacementError
    from swarm.spans import SpanLost

    try:
        gen = generator(args.model)
    except ModelMissing as exc:  # a known model not installed here: say how to get it
        raise LocalError(str(exc)) from None
    except WeightsError as exc:  # a file this code cannot run: say why
        raise ConfigError(str(exc)) from None
    # the whole request is checked before joining: a bad one costs no network round trip
    try:
        ids = gen.tokenizer.encode(args.prompt) if args.raw else gen.chat_prompt(
            [{"role": "user", "content": args.prompt}])
        gen.stream(ids, max_tokens=args.max_tokens, temperature=args.temperature,
                   top_p=args.top_p, seed=args.seed, stop=args.stop)
    except (GenerationError, ChatError) as exc:  # ChatError: the template failed
        raise ConfigError(str(exc)) from None
    client = connect(args, args.min_workers, args.timeout,
                     hint=" --min-workers 0 runs the model here")
    usage = Usage()
    text: list[str] = []
    started = time.monotonic()
    first = None
    with client:
        try:
            forward = client.span_model(args.model) if client.workers() else None
        except PlacementError as exc:
            raise SwarmError(f"the swarm's workers cannot hold {gen.name}: {exc}") from None
        try:
            for piece in client.generate(args.prompt, chat=not args.raw,
                                         max_tokens=args.max_tokens,
                                         temperature=args.temperature, top_p=args.top_p,
                                         seed=args.seed, stop=args.stop, usage=usage,
                                         model=args.model, forward=forward):
                first = first or time.monotonic()
                text.append(piece)
                if not args.json:
                    sys.stdout.write(piece)
                    sys.stdout.flush()
        except SpanLost as exc:  # a worker lost mid-text, its blocks placeable nowhere
            if text and not args.json:
                sys.stdout.write("\n")
            raise SwarmError(f"the swarm's workers cannot hold {gen.name} any more: "
                             f"{exc}") from None
        ran = _where(forward)
    seconds = time.monotonic() - started
    if args.json:
        print_json({"model": gen.name, "model_id": gen.address, "text": "".join(text),
                    "finish_reason": usage.finish_reason,
                    "usage": {"prompt_tokens": usage.prompt_tokens,
                              "completion_tokens": usage.completion_tokens,
                              "total_tokens": usage.prompt_tokens + usage.completion_tokens},
                    "seconds": round(seconds, 3),
                    "first_text_s": round((first or time.monotonic()) - started, 3),
                    **ran})
    else:
        sys.stdout.write("\n")
        spans = ", ".join(f"{a}-{b} on {w[:12] if w else 'this machine'}"
                          for (a, b), w in ((s["layers"], s["worker"]) for s in ran["spans"]))
        print(f"blocks {spans}; every value checked here ({ran['checked_calls']} span calls "
              f"checked, {ran['rejected']} rejected)" if ran["spans"] else
              "no worker: the whole forward ran on this machine", file=sys.stderr)
    return 0


def _where(model) -> dict:
    """Where each span of blocks ran and what its checks found (the --json keys)."""
    if model is None:
        return {"spans": [], "checked_calls": 0, "rejected": 0}
    st = model.take_stats()
    return {"spans": [{"layers": [first, first + count - 1], "worker": str(w) if w else None}
                      for (first, count), w in zip(model.plan, model.hosts(), strict=True)],
            "checked_calls": st.calls, "rejected": st.rejected}
