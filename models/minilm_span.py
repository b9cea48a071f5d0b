"""MiniLM's six layers run whole on a worker, and the requester's check of what it sent back
(sans-IO, numpy only).

A worker is sent the layers' weights once, as one content-addressed *bundle* (:func:`bundle`),
and per call a batch's first-layer input (the embedding lookup, made by the requester) with
the sentences' lengths. It runs :func:`models.minilm.run_layers` and answers with the
**trace**: the output of every weight product of every layer (:func:`trace_blocks`), one
float32 vector. Products' inputs are not in it: each is a function of the call's input and the
outputs before it.

The requester never takes the worker's word for anything: it runs the same pass itself, with
its own non-linear steps (attention, LayerNorm, GELU, residuals), taking each product from the
trace only after Freivalds' check of that output against the requester's own input and the
weight's fingerprint ``W @ R`` (:class:`models.span.Fingerprints`: ``O(rows * (k + n))``
instead of the product's ``O(rows * k * n)``). A worker whose non-linear steps differ honestly
(another CPU's rounding) produced outputs from inputs a few ulps away: the check's rounding
allowance covers that; anything more is a wrong product for the input the trace implies.
That is exact evidence: anyone holding the call's input, the bundle and the signed trace
re-runs this pass and finds the same product wrong (swarm.runtime.evidence).

Why whole layers (docs/architecture.md, "Models on the swarm"): a product-by-product forward
pays a round trip, an input sent and a job's overhead for each of 24 products a batch; here a
batch costs one call per worker, and only outputs travel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from compute.verify import judge
from models.executor import Weight
from models.minilm import DIM, LAYERS, PARTS, Layer, run_layers
from models.ops import Tap
from models.span import Fingerprints

WIDTHS = {"qkv": 3 * DIM, "out": DIM, "up": 4 * DIM, "down": DIM}
"""Columns of each product's output."""
SHAPES = {"qkv": (DIM, 3 * DIM), "out": (DIM, DIM), "up": (DIM, 4 * DIM), "down": (4 * DIM, DIM)}
"""Each weight's [in, out] shape."""
TRACE_WIDTH = LAYERS * sum(WIDTHS.values())
"""Floats of trace per token: 20,736 (83 KB)."""


class TraceMismatch(ValueError):
    """A trace the requester cannot use: the wrong size, or a product that is not the
    requester's own input times the weight (a wrong matmul the worker signed: provable)."""

    def __init__(self, layer: int, part: str, why: str) -> None:
        super().__init__(f"layer {layer} {part}: {why}")
        self.layer, self.part = layer, part


def _layer_parts(layer: Layer) -> list[np.ndarray]:
    return [layer.qkv.array, layer.qkv_bias, layer.out.array, layer.out_bias, *layer.ln1,
            layer.up.array, layer.up_bias, layer.down.array, layer.down_bias, *layer.ln2]


def bundle(layers: Sequence[Layer]) -> np.ndarray:
    """Every layer's matrices and vectors as one float32 vector (22 M floats, 85 MB): what a
    worker is sent once and names by content address after."""
    return np.concatenate([np.ravel(p) for layer in layers for p in _layer_parts(layer)]
                          ).astype(np.float32, copy=False)


def bundle_size() -> int:
    """Floats in a bundle: per layer its four matrices, three biases and two LayerNorms."""
    vectors = 3 * DIM + DIM + 4 * DIM + DIM + 2 * (2 * DIM)
    return LAYERS * (sum(k * n for k, n in SHAPES.values()) + vectors)


def unbundle(flat: np.ndarray) -> list[Layer]:
    """The layers of a bundle, as views; ValueError when its size does not fit."""
    if flat.ndim != 1 or flat.dtype != np.float32 or flat.size != bundle_size():
        raise ValueError(f"MiniLM's bundle is float32 [{bundle_size()}], got {flat.dtype} "
                         f"{flat.shape}")
    at = 0

    def take(*shape: int) -> np.ndarray:
        nonlocal at
        size = int(np.prod(shape))
        view = flat[at:at + size].reshape(shape)
        at += size
        return view

    layers = []
    for _ in range(LAYERS):
        qkv, qkv_bias = Weight(take(*SHAPES["qkv"])), take(3 * DIM)
        out, out_bias, ln1 = Weight(take(*SHAPES["out"])), take(DIM), (take(DIM), take(DIM))
        up, up_bias = Weight(take(*SHAPES["up"])), take(4 * DIM)
        down, down_bias, ln2 = Weight(take(*SHAPES["down"])), take(DIM), (take(DIM), take(DIM))
        layers.append(Layer(qkv, qkv_bias, out, out_bias, ln1, up, up_bias, down, down_bias,
                            ln2))
    return layers


def trace_blocks(trace: np.ndarray, tokens: int) -> list[dict[str, np.ndarray]]:
    """Per layer, each product's output as a C-contiguous [tokens, width] view of ``trace``
    (layer by layer, products in :data:`PARTS` order)."""
    blocks, at = [], 0
    for _ in range(LAYERS):
        layer = {}
        for part in PARTS:
            size = tokens * WIDTHS[part]
            layer[part] = trace[at:at + size].reshape(tokens, WIDTHS[part])
            at += size
        blocks.append(layer)
    return blocks


def check_lengths(lengths: object, tokens: int) -> np.ndarray:
    """``lengths`` (a list of ints from the wire) as int64, or ValueError: each sentence
    2..256 tokens ([CLS] and [SEP] at least), summing to ``tokens``."""
    if not isinstance(lengths, list) or not lengths or not all(
            isinstance(n, int) and not isinstance(n, bool) and 2 <= n <= 256 for n in lengths):
        raise ValueError("lengths= must list each sentence's tokens (2..256)")
    if sum(lengths) != tokens:
        raise ValueError(f"lengths= sum to {sum(lengths)}, x has {tokens} rows")
    return np.asarray(lengths, np.int64)


def traced(layers: Sequence[Layer], x: np.ndarray, lengths: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:
    """The worker's side: run the layers, each product written straight into a fresh trace;
    returns (trace, hidden states after the last layer)."""
    tokens = x.shape[0]
    trace = np.empty(tokens * TRACE_WIDTH, np.float32)
    blocks = trace_blocks(trace, tokens)

    def products(j: int, part: str, x: np.ndarray) -> np.ndarray:
        return np.matmul(x, getattr(layers[j], part).array, out=blocks[j][part])

    return trace, run_layers(layers, x, lengths, products)


class TraceCheck:
    """The requester's side: products taken from ``trace``, each checked against the input
    the pass computed here (:class:`models.minilm.Check`); :func:`run_layers` with this as
    both ``products`` and ``check`` raises :class:`TraceMismatch` at the first product that
    is not its input times the weight.

    Each check has two sides (compute.verify.judge): the input's projection, taken by the
    step that writes it (LayerNorm, GELU) or by a pass of its own where none does (the first
    layer's input, attention's output), and the output's, taken by the step that reads it
    (attention, LayerNorm, GELU). Both are the same sums a pass over memory would give, taken
    while the rows are in cache: about half the CPU of passes of their own
    (docs/architecture.md)."""

    def __init__(self, trace: np.ndarray, tokens: int, layers: Sequence[Layer],
                 fingerprints: Fingerprints) -> None:
        if trace.ndim != 1 or trace.dtype != np.float32 or trace.size != tokens * TRACE_WIDTH:
            raise TraceMismatch(0, "trace", f"a trace of {tokens} tokens is float32 "
                                            f"[{tokens * TRACE_WIDTH}], got {trace.dtype} "
                                            f"{trace.shape}")
        self.trace, self.blocks = trace, trace_blocks(trace, tokens)
        self.tokens, self.layers, self.fingerprints = tokens, layers, fingerprints
        self._sides: dict[tuple[int, str], _Sides] = {}

    def _sides_of(self, j: int, part: str) -> _Sides:
        sides = self._sides.get((j, part))
        if sides is None:
            w = getattr(self.layers[j], part).array
            sides = self._sides[(j, part)] = _Sides(w, *self.fingerprints.vectors(w))
        return sides

    def __call__(self, j: int, part: str, x: np.ndarray) -> np.ndarray:
        sides = self._sides_of(j, part)
        if sides.input is None:  # no step wrote this input: a pass of its own
            sides.input = Tap(sides.br, sides.norms2, self.tokens).take(x)
        return self.blocks[j][part]

    def output(self, j: int, part: str) -> Tap:
        sides = self._sides_of(j, part)
        sides.output = Tap(sides.r, None, self.tokens)
        return sides.output

    def input(self, j: int, part: str) -> Tap | None:
        if j >= len(self.layers):
            return None
        sides = self._sides_of(j, part)
        sides.input = Tap(sides.br, sides.norms2, self.tokens)
        return sides.input

    def judge(self, j: int, part: str) -> None:
        sides = self._sides.pop((j, part))
        if sides.input is None or sides.output is None:
            raise RuntimeError(f"layer {j} {part}: judged before both sides were taken")
        if not judge(sides.input.proj, sides.input.sq, sides.output.proj, sides.output.sq,
                     sides.w.shape):
            raise TraceMismatch(j, part, "the output is not the pass's input times the weight")


@dataclass
class _Sides:
    """One product's check vectors and the two sides of its check as they are taken."""

    w: np.ndarray
    r: np.ndarray
    br: np.ndarray
    norms2: np.ndarray
    input: Tap | None = None
    output: Tap | None = None
