"""A multi-layer perceptron classifier trained block by block, every product checkable
(sans-IO, numpy only).

The model is a spec like ``mlp:784-128-10`` (any depth): dense layers ``h = a @ W + b``,
ReLU between them, softmax cross-entropy on the last. Its parameters are one float32 vector
(:func:`unbundle` gives each layer's ``W [in, out]`` and ``b [out]`` as views): what travels
to a worker once a step, and what SGD updates.

A *block* is a run of consecutive samples of a batch; its gradient is the sum of its samples'
gradients. :func:`run_block` makes one block's pass forward and backward with its matrix
products behind a hook, as MiniLM's layers are (models.minilm_span):

- a worker's hook computes each product into one float32 vector, the block's **trace**
  (:func:`traced`): forward ``Z_l = A_l @ W_l``; backward ``dA_l = dZ_l @ W_lᵀ`` (l > 0) and
  ``dW_l = A_lᵀ @ dZ_l``;
- the trainer's hook (:class:`TraceCheck`) takes each product from the trace only after
  Freivalds' check against the trainer's own input (its own ReLU masks and softmax,
  recomputed from the checked outputs before them), so a worker's gradient enters the sum only
  when every product in it is right;
- the evidence judge's hook (swarm.runtime.evidence) re-runs the same pass with the exact
  worst-case bound.

The non-linear steps (bias, ReLU and its mask, softmax, the loss, the bias gradients) are
always the caller's own. The step's gradient is the sum of the blocks' in block order
(:func:`blocks_of` depends on the batch alone), so two workers, or none, give one curve.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from compute.verify import ROUNDS, draw_vectors, judge

MAX_LAYERS = 16
MAX_WIDTH = 1 << 16
MAX_PARAMS = 1 << 28
"""Most parameters (1 GiB of float32: the wire's largest array)."""
MAX_CLASSES = 1 << 16
BLOCKS = 4
"""Blocks per batch: a batch's work comes in this many pieces (the scheduler deals them by
measured speed; a piece is redone elsewhere when its worker is lost or late)."""
MAX_BLOCK = 1024
"""Most samples in one block (one worker call)."""
SOFTMAX_SLACK = 2.0**-16
"""How far an honest backend's softmax gradient ``p - onehot`` may be from ours, per element:
``p`` lies in [0, 1] and another exp/log is a few ulps (2**-24) off; evidence charges every
product fed by it this much on top of its rounding (swarm.runtime.evidence)."""

PRECISIONS = {"f32": 0.0, "f16": 2.0**-11, "bf16": 2.0**-8}
"""What a trace may travel in, and its unit roundoff. In f16 or bf16 a worker rounds each
product's output as it computes it and goes on from the rounded value (:func:`round_to`), so
the trainer, which recomputes every input from the outputs it received, gets exactly the
worker's inputs; each output is then within its format's rounding of the product of its
input, which the check allows for (``compute.verify.judge``'s ``output_unit``, and
:data:`SUBNORMAL_ROUNDING` for the format's smallest values)."""
SUBNORMAL_ROUNDING = {"f32": 0.0, "f16": 2.0**-25, "bf16": 2.0**-134}
"""How far a format's rounding (:func:`round_to`: to nearest, subnormals kept) may move an
element below its smallest normal value: half its subnormals' spacing, whatever the element's
size (``output_unit`` covers a fraction of the element only: in f16, whose subnormals start
below 6.1e-5, honest ``dW`` rows of small values failed the check 2 times in 3)."""

Products = Callable[[str, int, np.ndarray, np.ndarray], np.ndarray]
"""``products(kind, layer, left, right)``: ``"z"``: ``left @ right`` (activations times the
weight), ``"da"``: ``left @ right.T`` (the output's gradient times the weight, transposed),
``"dw"``: ``left.T @ right`` (the weight's gradient)."""


def parse_spec(text: object) -> tuple[int, ...]:
    """``"mlp:784-128-10"`` as layer widths, or ValueError saying what is wrong."""
    if not isinstance(text, str) or not re.fullmatch(r"mlp:\d+(-\d+)+", text.strip()):
        raise ValueError(f"model spec {str(text)[:60]!r} does not parse: write "
                         "mlp:IN-HIDDEN...-CLASSES, e.g. mlp:784-128-10")
    return check_sizes([int(n) for n in text.strip()[4:].split("-")])


def check_sizes(sizes: object) -> tuple[int, ...]:
    """Layer widths (inputs, hidden..., classes) as a tuple, or ValueError."""
    if not isinstance(sizes, list | tuple) or not 2 <= len(sizes) <= MAX_LAYERS + 1 or not all(
            isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_WIDTH
            for n in sizes):
        raise ValueError(f"a model has 1..{MAX_LAYERS} layers, each width 1..{MAX_WIDTH}")
    if sizes[-1] < 2:
        raise ValueError("a classifier needs at least 2 classes")
    if param_count(tuple(sizes)) > MAX_PARAMS:
        raise ValueError(f"the model has over {MAX_PARAMS} parameters")
    return tuple(sizes)


def spec_text(sizes: Sequence[int]) -> str:
    return "mlp:" + "-".join(map(str, sizes))


def param_count(sizes: Sequence[int]) -> int:
    return sum(i * o + o for i, o in zip(sizes, sizes[1:], strict=False))


def unbundle(flat: np.ndarray, sizes: Sequence[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each layer's ``(W [in, out], b [out])`` as views of ``flat``."""
    if flat.ndim != 1 or flat.size != param_count(sizes):
        raise ValueError(f"parameters of {spec_text(sizes)} are [{param_count(sizes)}], got "
                         f"{flat.shape}")
    out, at = [], 0
    for i, o in zip(sizes, sizes[1:], strict=False):
        w = flat[at:at + i * o].reshape(i, o)
        at += i * o
        out.append((w, flat[at:at + o]))
        at += o
    return out


def init_params(sizes: Sequence[int], seed: int) -> np.ndarray:
    """Seeded initial parameters: He normal for layers followed by ReLU, LeCun normal for the
    last (its logits start small: the loss starts near ln(classes)); biases zero."""
    rng = np.random.default_rng(seed)
    flat = np.zeros(param_count(sizes), np.float32)
    layers = unbundle(flat, sizes)
    for j, (w, _) in enumerate(layers):
        gain = 1.0 if j == len(layers) - 1 else 2.0
        w[...] = rng.standard_normal(w.shape, dtype=np.float32) * np.float32(
            math.sqrt(gain / w.shape[0]))
    return flat


def blocks_of(batch: int) -> list[slice]:
    """A batch's blocks: :data:`BLOCKS` runs of nearly equal size (fewer for tiny batches),
    at most :data:`MAX_BLOCK` samples each. A function of ``batch`` alone: the summation
    order of a step's gradient never depends on who computed it."""
    parts = max(min(BLOCKS, batch), -(-batch // MAX_BLOCK))
    edges = [batch * p // parts for p in range(parts + 1)]
    return [slice(a, b) for a, b in zip(edges, edges[1:], strict=False) if b > a]


# -- one block ---------------------------------------------------------------------------


def trace_size(sizes: Sequence[int], rows: int) -> int:
    """Floats in a block's trace: every ``Z_l``, every ``dW_l`` and ``dA_l`` for l > 0."""
    layers = list(zip(sizes, sizes[1:], strict=False))
    return (sum(rows * o for _, o in layers) + sum(i * o for i, o in layers)
            + sum(rows * i for i, _ in layers[1:]))


def trace_views(trace: np.ndarray, sizes: Sequence[int], rows: int
                ) -> dict[tuple[str, int], np.ndarray]:
    """Each product's output as a C-contiguous view of ``trace``: ``("z", l)``,
    ``("dw", l)``, ``("da", l)`` (forward first, then the backward's, layer by layer)."""
    layers = list(zip(sizes, sizes[1:], strict=False))
    views, at = {}, 0

    def take(key: tuple[str, int], shape: tuple[int, int]) -> None:
        nonlocal at
        size = shape[0] * shape[1]
        views[key] = trace[at:at + size].reshape(shape)
        at += size

    for j, (_, o) in enumerate(layers):
        take(("z", j), (rows, o))
    for j, (i, o) in enumerate(layers):
        take(("dw", j), (i, o))
        if j > 0:
            take(("da", j), (rows, i))
    return views


@dataclass
class BlockResult:
    """What a block's pass gives its caller."""

    grads: list[tuple[np.ndarray, np.ndarray]]
    """Per layer ``(dW, db)``: the sums of the block's per-sample gradients (``dW`` as the
    product gave it: a view of a worker's trace, not copied)."""
    loss: float
    """Sum of the samples' cross-entropy losses."""
    correct: int
    """Samples whose largest logit is their label."""
    rows: int
    """Samples in the block."""
    check_seconds: float = 0.0
    """Thread time of the products' checks alone (:class:`TraceCheck`; 0 for a local pass)."""

    @property
    def grad(self) -> np.ndarray:
        """The gradients as one vector (the parameters' layout)."""
        return np.concatenate([a.ravel() for pair in self.grads for a in pair])


def run_block(params: np.ndarray, sizes: Sequence[int], x: np.ndarray, y: np.ndarray,
              products: Products) -> BlockResult:
    """One block forward and backward, each matrix product from ``products`` (module
    docstring), every other step here, in float32."""
    layers = unbundle(params, sizes)
    grads: list[tuple[np.ndarray, np.ndarray]] = [None] * len(layers)  # type: ignore[list-item]
    acts, masks = [np.ascontiguousarray(x, np.float32)], []
    h = acts[0]
    for j, (w, b) in enumerate(layers):
        h = products("z", j, acts[j], w) + b
        if j < len(layers) - 1:
            mask = h > 0
            masks.append(mask)
            acts.append(np.where(mask, h, np.float32(0)))
    rows = np.arange(h.shape[0])
    # the softmax in float64, rounded once to float32: any backend's exp and sum in float64
    # (a tab's JavaScript, another CPU's numpy) give the same float32 gradient but for a
    # one-in-10^8 tie, so the trainer's own inputs to the backward's products are the worker's
    wide = h.astype(np.float64)
    shifted = wide - wide.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    s = e.sum(axis=1, keepdims=True)
    loss = float(np.sum(np.log(s[:, 0]) - shifted[rows, y]))
    correct = int(np.sum(h.argmax(axis=1) == y))
    dz = (e / s).astype(np.float32)
    dz[rows, y] -= np.float32(1)
    for j in range(len(layers) - 1, -1, -1):
        grads[j] = (products("dw", j, acts[j], dz), dz.sum(axis=0))
        if j > 0:
            dz = products("da", j, dz, layers[j][0]) * masks[j - 1]
    return BlockResult(grads, loss, correct, len(y))


def round_to(a: np.ndarray, precision: str) -> np.ndarray:
    """``a`` (float32, in place) rounded to the nearest value of ``precision`` (ties to even,
    as swarm.wire's transfer casts round), still as float32; returns ``a``."""
    if precision == "f16":
        with np.errstate(over="ignore"):
            a[...] = a.astype(np.float16)
    elif precision == "bf16":
        bits = a.view(np.uint32)
        nan = np.isnan(a)
        bits[...] = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
        a[nan] = np.nan
    elif precision != "f32":
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return a


def _product(kind: str, left: np.ndarray, right: np.ndarray, out: np.ndarray | None = None
             ) -> np.ndarray:
    if kind == "z":
        return np.matmul(left, right, out=out)
    if kind == "dw":
        return np.matmul(left.T, right, out=out)
    return np.matmul(left, right.T, out=out)


def local_products(kind: str, layer: int, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """The products computed here (numpy)."""
    del layer
    return _product(kind, left, right)


def rounded_products(precision: str) -> Products:
    """The products computed here, each rounded to ``precision`` as a worker's would be."""
    if precision == "f32":
        return local_products

    def products(kind: str, layer: int, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        del layer
        return round_to(_product(kind, left, right), precision)

    return products


def traced(params: np.ndarray, sizes: Sequence[int], x: np.ndarray, y: np.ndarray,
           precision: str = "f32") -> np.ndarray:
    """The worker's side: the block's pass, each product written straight into its trace
    (and rounded there to ``precision``, the pass going on from the rounded value)."""
    return traced_block(params, sizes, x, y, precision)[0]


def traced_block(params: np.ndarray, sizes: Sequence[int], x: np.ndarray, y: np.ndarray,
                 precision: str = "f32") -> tuple[np.ndarray, BlockResult]:
    """:func:`traced`, with the worker's own result of the pass (its loss and correct count:
    what its node's panel draws)."""
    trace = np.empty(trace_size(sizes, x.shape[0]), np.float32)
    views = trace_views(trace, sizes, x.shape[0])

    def products(kind: str, layer: int, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        return round_to(_product(kind, left, right, out=views[(kind, layer)]), precision)

    return trace, run_block(params, sizes, x, y, products)


class TraceMismatch(ValueError):
    """A trace the trainer cannot use: the wrong size, or a product that is not the
    trainer's own input times the weight (a wrong matmul the worker signed: provable)."""

    def __init__(self, kind: str, layer: int, why: str) -> None:
        super().__init__(f"layer {layer} {kind}: {why}")
        self.kind, self.layer = kind, layer


LayerCheck = tuple[tuple, tuple | None, np.ndarray]
"""One layer's part of :class:`StepWeights`: ``(forward, backward, dW's vectors)``."""


def layer_check(j: int, w: np.ndarray) -> LayerCheck:
    """Layer ``j``'s check vectors and fingerprints from one read of its ``w``
    (models.mlp_loops): ``(r, W r, W's row norms²)`` for the forward, ``(r', Wᵀ r', W's
    column norms²)`` for the backward (None for layer 0: nothing flows back into the data),
    and the vectors of ``dW = Aᵀ dZ`` (``dZ`` is each block's own: that side is made per
    block)."""
    from models.mlp_loops import fingerprints

    r = draw_vectors(w.shape[1], ROUNDS)
    rb = None if j == 0 else draw_vectors(w.shape[0], ROUNDS)
    wr, rows2, wtr, cols2 = fingerprints(w, r, rb)
    return (r, wr, rows2), (None if rb is None else (rb, wtr, cols2)), \
        draw_vectors(w.shape[1], ROUNDS)


class StepWeights:
    """One step's weights as the trainer checks products by them: per layer, secret check
    vectors for ``W`` (the forward's ``A @ W``) and for ``Wᵀ`` (the backward's ``dZ @ Wᵀ``),
    their fingerprints ``W @ R`` and ``Wᵀ @ R'`` and the squared row norms of ``W`` and
    ``Wᵀ`` (:func:`layer_check`): made once a step (the weights change every step), and
    shared by the step's blocks' checks (threads). ``made``: each layer's, made already (by
    the trainer right after it updated that layer, while its weights were in cache)."""

    def __init__(self, params: np.ndarray, sizes: Sequence[int],
                 made: Sequence[LayerCheck] | None = None) -> None:
        self.params, self.sizes = params, tuple(sizes)
        self.layers = unbundle(params, sizes)
        if made is None:
            made = [layer_check(j, w) for j, (w, _) in enumerate(self.layers)]
        if len(made) != len(self.layers):
            raise ValueError(f"{len(made)} layers' checks for {len(self.layers)} layers")
        self.forward = [_sides_of(f) for f, _, _ in made]
        self.backward = [None if b is None else _sides_of(b) for _, b, _ in made]
        self.grads = [np.ascontiguousarray(g.T) for _, _, g in made]
        """Each layer's ``dW`` check vectors, transposed (``rᵀ``)."""


def _sides_of(check: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A weight's ``(r, b @ r, b's row norms²)`` as :func:`models.mlp_loops.product_sides`
    takes them: ``(rᵀ, (b @ r)ᵀ, row norms²)``, C-contiguous."""
    r, br, norms2 = check
    return np.ascontiguousarray(r.T), np.ascontiguousarray(br.T), norms2


class TraceCheck:
    """The trainer's hook: each product taken from a worker's ``trace`` after Freivalds'
    check against the input this pass computed (:class:`TraceMismatch` otherwise)."""

    def __init__(self, trace: object, step: StepWeights, rows: int,
                 precision: str = "f32") -> None:
        size = trace_size(step.sizes, rows)
        if not isinstance(trace, np.ndarray) or trace.dtype != np.float32 \
                or trace.shape != (size,):
            raise TraceMismatch("trace", 0, f"a block of {rows} is float32 [{size}], got "
                                f"{getattr(trace, 'dtype', type(trace).__name__)} "
                                f"{getattr(trace, 'shape', '')}")
        self.step = step
        self.views = trace_views(trace, step.sizes, rows)
        self.unit = PRECISIONS[precision]
        self.floor = (SUBNORMAL_ROUNDING[precision] / self.unit) ** 2 if self.unit else 0.0
        """Per element of a row, what its squared norm gains so that the threshold allows
        each element :data:`SUBNORMAL_ROUNDING` on top (``judge`` scales the norms by
        ``output_unit²``: a row of ``n`` gains ``n * SUBNORMAL_ROUNDING²`` of variance)."""
        self.seconds = 0.0
        """Thread time spent in the checks so far."""

    def __call__(self, kind: str, layer: int, left: np.ndarray, right: np.ndarray
                 ) -> np.ndarray:
        from models.mlp_loops import gradient_sides, product_sides

        out = self.views[(kind, layer)]
        step = self.step
        t0 = time.thread_time()
        if kind == "dw":  # dW = Aᵀ dZ: dZ is this block's own, its side is made here
            shape = right.shape
            sides = gradient_sides(left, right, step.grads[layer], out)
        else:  # "z": A @ W; "da": dZ @ Wᵀ (b is Wᵀ, its side made from W: layer_check)
            rt, brt, norms2 = (step.forward if kind == "z" else step.backward)[layer]
            shape = (brt.shape[1], rt.shape[1])
            sides = product_sides(left, brt, norms2, out, rt)
        z, q, cr, c2 = sides
        if self.floor:
            c2 = c2 + out.shape[1] * self.floor
        ok = judge(z, q, cr, c2, shape, output_unit=self.unit)
        self.seconds += time.thread_time() - t0
        if not ok:
            raise TraceMismatch(kind, layer, "the output is not the pass's input times the "
                                             "weight")
        return out


def check_block(step: StepWeights, x: np.ndarray, y: np.ndarray, trace: object,
                precision: str = "f32") -> BlockResult:
    """A worker's block, checked: its gradient, loss and correct count, every product
    checked against this pass's own inputs; :class:`TraceMismatch` at the first wrong one.
    ``trace``: float32 (a trace that travelled in f16 or bf16, widened: ``precision``)."""
    checked = TraceCheck(trace, step, x.shape[0], precision)
    with np.errstate(over="ignore", invalid="ignore"):
        result = run_block(step.params, step.sizes, x, y, checked)
    result.check_seconds = checked.seconds
    return result


def check_labels(labels: object, rows: int, classes: int) -> np.ndarray:
    """``labels`` (a list of ints from the wire) as int64, or ValueError."""
    if not isinstance(labels, list) or len(labels) != rows or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v < classes
            for v in labels):
        raise ValueError(f"labels= must list {rows} class indices (0..{classes - 1})")
    return np.asarray(labels, np.int64)


def check_grad_call(arrays: Sequence[np.ndarray], params: dict) -> tuple[int, ...]:
    """A worker call's arrays ``(x, parameters)`` and parameters ``sizes=``, ``labels=``,
    checked on both ends (untrusted input); returns the sizes."""
    if len(arrays) != 2:
        raise TypeError(f"grad takes 2 arrays (x, parameters), got {len(arrays)}")
    extra = set(params) - {"sizes", "labels", "precision"}
    if extra:
        raise TypeError(f"grad takes sizes=, labels=, precision=; got {sorted(extra)}")
    if params.get("precision", "f32") not in PRECISIONS:
        raise ValueError(f"precision= must be one of {', '.join(PRECISIONS)}")
    sizes = check_sizes(params.get("sizes"))
    x, flat = arrays
    if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim != 2 \
            or x.shape[1] != sizes[0] or not 1 <= x.shape[0] <= MAX_BLOCK:
        raise ValueError(f"x must be float32 [1..{MAX_BLOCK}, {sizes[0]}]")
    if not isinstance(flat, np.ndarray) or flat.dtype != np.float32 \
            or flat.shape != (param_count(sizes),):
        raise ValueError(f"the parameters must be float32 [{param_count(sizes)}]")
    check_labels(params.get("labels"), x.shape[0], sizes[-1])
    if trace_size(sizes, x.shape[0]) > MAX_PARAMS:
        raise ValueError("the trace would be too large: send fewer rows")
    return sizes
