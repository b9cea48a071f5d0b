"""Text generation: a prompt in, text pieces out as they are decoded, stopping at the end of
sequence token, at a stop string, or after ``max_tokens``.

Requests are checked before any work: an empty prompt, a prompt longer than the context, a
``max_tokens`` outside 1..(room left in the context), a bad temperature or top_p each raise
:class:`GenerationError` with the limit named. Text is streamed as whole UTF-8 characters
(a token that ends inside a character waits for the next), and text that might be the start of
a stop string is held back until it is known not to be.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from threadpoolctl import ThreadpoolController

from models import catalog, gguf_weights
from models.llama import Llama
from models.sampling import Sampler, Sampling
from models.tokenizer_bpe import BPETokenizer, TokenizerError


class GenerationError(ValueError):
    """A request that cannot be run as asked; the message says what to change."""


@dataclass(frozen=True)
class Piece:
    """One step of output: ``text`` (possibly empty while a character or a possible stop
    string is incomplete), the token chosen, and, on the last piece, why it stopped."""

    text: str
    token: int | None
    finish_reason: str | None = None  # "stop" (EOS or stop string) | "length"


@dataclass
class Usage:
    """Filled in as a generation runs (OpenAI's usage figures, and why it stopped)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None


@dataclass
class Generator:
    model: Llama
    tokenizer: BPETokenizer
    stop_ids: set[int] = field(default_factory=set)
    """Default: the tokenizer's (the file's eos, eot and turn-end tokens)."""

    def __post_init__(self):
        self.stop_ids = set(self.stop_ids or self.tokenizer.stop_ids)

    @property
    def name(self) -> str:
        """The model's display name."""
        return self.model.weights.name

    @property
    def address(self) -> str:
        """The model's id: its file's content address."""
        return self.model.weights.address

    def using(self, model: Llama) -> Generator:
        """The same tokenizer and stops over another forward of the same weights (on the
        swarm, or with another executor)."""
        return Generator(model, self.tokenizer, set(self.stop_ids))

    @property
    def context_length(self) -> int:
        return self.model.config.context_length

    def chat_prompt(self, messages: Sequence[dict]) -> list[int]:
        return self.tokenizer.encode(self.tokenizer.render_chat(messages))

    def check(self, prompt_ids: Sequence[int], max_tokens: int) -> None:
        n, ctx = len(prompt_ids), self.context_length
        if n == 0:
            raise GenerationError("the prompt is empty: give some text to continue")
        if n >= ctx:
            raise GenerationError(f"the prompt is {n} tokens; the model's context is {ctx} "
                                  f"tokens, and at least one must be left to generate")
        room = ctx - n
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) \
                or not 1 <= max_tokens <= room:
            raise GenerationError(f"max_tokens must be an integer from 1 to {room} (the "
                                  f"context of {ctx} tokens less the prompt's {n}), got "
                                  f"{max_tokens!r}")

    def stream(self, prompt: str | Sequence[int], *, max_tokens: int = 256,
               temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
               stop: Sequence[str] = (), usage: Usage | None = None) -> Iterator[Piece]:
        """Generate after ``prompt`` (text, or token ids already encoded). The request is
        checked here, before the first piece is asked for."""
        ids, decode = self.prepare(prompt, max_tokens=max_tokens, temperature=temperature,
                                   top_p=top_p, seed=seed, stop=stop, usage=usage)
        return self._run(ids, decode)

    def stream_batched(self, prompt: str | Sequence[int], **kw) -> Iterator[Piece]:
        """As :meth:`stream`, with every other sequence streamed this way from the same
        forward in one batch: it joins the running batch at its next step
        (models.batching)."""
        from models.batching import batcher

        ids, decode = self.prepare(prompt, **kw)
        return batcher(self).stream(ids, decode)

    def prepare(self, prompt: str | Sequence[int], *, max_tokens: int = 256,
                temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
                stop: Sequence[str] = (), usage: Usage | None = None
                ) -> tuple[list[int], Decode]:
        """A checked request: its prompt ids and the decoding that follows its forwards."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self.check(ids, max_tokens)
        try:
            sampler = Sampler(Sampling(temperature, top_p, seed))
        except ValueError as e:
            raise GenerationError(str(e)) from None
        if isinstance(stop, str) or not all(isinstance(s, str) and s for s in stop):
            raise GenerationError("stop must be a list of non-empty strings")
        usage = usage if usage is not None else Usage()
        usage.prompt_tokens, usage.completion_tokens = len(ids), 0
        return ids, Decode(self, max_tokens, sampler, list(stop), usage)

    def _run(self, ids: list[int], decode: Decode) -> Iterator[Piece]:
        cache = self.model.new_cache(decode.capacity(ids))
        with _blas().limit(limits=1, user_api="blas"):
            logits = self.model.forward(ids, cache)
        while True:
            piece = decode.step(logits)
            yield piece
            if piece.finish_reason:
                return
            with _blas().limit(limits=1, user_api="blas"):
                logits = self.model.forward([piece.token], cache)

    def complete(self, prompt: str | Sequence[int], **kw) -> tuple[str, str]:
        """The whole text and its finish reason."""
        text, reason = [], None
        for piece in self.stream(prompt, **kw):
            text.append(piece.text)
            reason = piece.finish_reason
        return "".join(text), reason or "length"


class Decode:
    """One sequence's decoding after each forward (sans-IO): sample a token, detokenise,
    stop at an end token, a stop string or ``max_tokens``; text that may begin a stop string
    or ends inside a character is held back."""

    def __init__(self, gen: Generator, max_tokens: int, sampler: Sampler, stops: list[str],
                 usage: Usage) -> None:
        self.gen, self.max_tokens, self.sampler = gen, max_tokens, sampler
        self.stops, self.usage = stops, usage
        self.out: list[int] = []
        self.sent = 0
        """Characters of the decoded text already given out."""

    def capacity(self, ids: Sequence[int]) -> int:
        """Positions to allocate a cache for up front (it grows beyond)."""
        return len(ids) + min(self.max_tokens, 256)

    def step(self, logits) -> Piece:
        """The piece after these logits; the last one carries its finish reason."""
        token = self.sampler(logits)
        usage, tok, out = self.usage, self.gen.tokenizer, self.out
        usage.completion_tokens += 1
        if token in self.gen.stop_ids:
            usage.finish_reason = "stop"
            return Piece(tok.decode(out)[self.sent:], token, "stop")  # held text
        out.append(token)
        text = tok.decode(out)
        hit = _first_stop(text, self.stops, self.sent)
        if hit is not None:
            usage.finish_reason = "stop"
            return Piece(text[self.sent:hit], token, "stop")
        if len(out) >= self.max_tokens:
            usage.finish_reason = "length"
            return Piece(text[self.sent:], token, "length")
        safe = _safe_end(text, self.stops)
        piece = Piece(text[self.sent:safe] if safe > self.sent else "", token)
        self.sent = max(self.sent, safe)
        return piece


def generator(model: str | Path | None = None) -> Generator:
    """The chat model named by ``model`` (a .gguf path or a known name: models.catalog; the
    default is SmolLM2), loaded once per process and per file content."""
    path, name = catalog.resolve(model)
    w = gguf_weights.load(path, name)
    with _lock:
        if w.address not in _generators:
            try:
                tokenizer = BPETokenizer(w.vocab)
            except TokenizerError as exc:
                raise gguf_weights.WeightsError(f"{path.name}: {exc}") from None
            _generators[w.address] = Generator(Llama(w), tokenizer)
        return _generators[w.address]


_generators: dict[str, Generator] = {}
_lock = threading.Lock()


@functools.cache
def _blas() -> ThreadpoolController:
    """Generation runs BLAS on one thread (its calls only, never the caller's code between
    pieces): a [1, 576] product is too small to split, and OpenBLAS's threads spin against
    each other when the cores are busy. Measured on 2 busy cores: a decode step 68 ms on one
    thread, 488 ms on two; 547 prompt positions 3.9-5.4 s on one, 30-32 s on two."""
    return ThreadpoolController()


def _first_stop(text: str, stops: Sequence[str], sent: int) -> int | None:
    """Where the earliest stop string starts, if one has appeared (searching only where a new
    one could begin: text before ``sent`` was checked already)."""
    starts = []
    for s in stops:
        i = text.find(s, max(0, sent - len(s) + 1))
        if i >= 0:
            starts.append(i)
    return min(starts) if starts else None


def _safe_end(text: str, stops: Sequence[str]) -> int:
    """How much of ``text`` can be sent: not a trailing incomplete character (decoded as
    U+FFFD) nor a tail that could still grow into a stop string."""
    end = len(text)
    while end and text[end - 1] == "\ufffd":
        end -= 1
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, end), 0, -1):
            if text[end - k:end] == s[:k]:
                hold = max(hold, k)
                break
    return end - hold
