"""Evidence of a wrong result that anyone can re-check: signed receipts (sans-IO).

A worker signs a :class:`Receipt` for every result: who asked (requester, task id), what
ran (actor, method, a digest of the parameters), the content addresses of the inputs as it
received them and of the outputs as it sent them. A requester whose check rejects a result
builds :class:`Evidence` (the receipt plus the parameters) and ships it with the arrays, by
content address, to the coordinator, which re-checks with :func:`check_evidence` and acts
on proof alone: a report that cannot be re-checked is not evidence, whoever sends it.

What the findings mean (the coordinator acts on a proven one):

``proven``
    the receipt is the accused worker's signature over these very inputs and this output,
    and the output is wrong (Freivalds with fresh vectors: an honest result is rejected with
    negligible probability, see ``compute.verify``).
``correct``
    the signed output is right: the report was false (the reporter is the liar).
``unproven``
    anything else (bad signature, arrays missing or not matching their addresses, a method
    that cannot be re-checked cheaply): nothing follows from it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

import compute
from compute.backend import check_operands
from compute.verify import ROUNDS, draw_vectors, residuals
from identity.keys import PeerId, PeerKey, verify
from identity.statements import cut_reason
from models import span as llama_span
from swarm import wire
from swarm.runtime.actors import (
    SpanConfig,
    check_matmul,
    check_minilm_forward,
    check_span_forward,
)
from swarm.runtime.objects import ID_LEN, ObjectId, object_id
from swarm.runtime.protocol import MAX_PARAMS

RECEIPT_CONTEXT = b"swarm/receipt/v1"
MAX_ARRAYS = 16
"""Inputs or outputs one receipt may name."""
MAX_EVIDENCE = 2 * MAX_PARAMS
"""Largest encoded evidence (parameters included)."""


@dataclass(frozen=True, slots=True)
class Receipt:
    """A worker's signed statement: "for these inputs I returned these outputs"."""

    worker: PeerId
    """The signer (the worker that ran the task)."""
    requester: PeerId
    """Who asked (the link's remote end, as the worker saw it)."""
    task: int
    """The requester's task id."""
    actor: str
    """Actor class name."""
    method: str
    """Method name."""
    params: bytes
    """SHA-256 of the task's msgpack parameters."""
    inputs: tuple[bytes, ...]
    """Content addresses of the inputs, as received (transfer precision)."""
    outputs: tuple[bytes, ...]
    """Content addresses of the outputs, as sent."""
    signature: bytes = b""
    """The worker's Ed25519 signature over :meth:`signed_part`."""

    def signed_part(self) -> bytes:
        return RECEIPT_CONTEXT + msgpack.packb(
            [self.worker.raw, self.requester.raw, self.task, self.actor, self.method,
             self.params, list(self.inputs), list(self.outputs)], use_bin_type=True)

    @classmethod
    def sign(cls, key: PeerKey, requester: PeerId, task: int, actor: str, method: str,
             params: bytes, inputs: list[bytes], outputs: list[bytes]) -> Receipt:
        unsigned = cls(key.peer_id, requester, task, actor, method, params_digest(params),
                       tuple(inputs), tuple(outputs))
        return dataclasses.replace(unsigned, signature=key.sign(unsigned.signed_part()))

    def valid(self) -> bool:
        """Whether the signature is the worker's over these fields."""
        return verify(self.worker, self.signature, self.signed_part())

    def encode(self) -> bytes:
        return msgpack.packb([self.worker.raw, self.requester.raw, self.task, self.actor,
                              self.method, self.params, list(self.inputs), list(self.outputs),
                              self.signature], use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes) -> Receipt:
        """Parse an encoded receipt; ValueError when it is malformed (untrusted input)."""
        o = _fields(data, 9, "receipt")
        worker, requester, task, actor, method, params, inputs, outputs, sig = o
        if not (isinstance(task, int) and isinstance(actor, str) and isinstance(method, str)
                and isinstance(params, bytes) and isinstance(sig, bytes)
                and isinstance(inputs, list) and isinstance(outputs, list)
                and len(inputs) <= MAX_ARRAYS and len(outputs) <= MAX_ARRAYS
                and all(isinstance(x, bytes) and len(x) == ID_LEN for x in inputs + outputs)
                and len(actor) <= 64 and len(method) <= 64):
            raise ValueError("receipt fields have the wrong types")
        try:
            return cls(PeerId(worker), PeerId(requester), task, actor, method, params,
                       tuple(inputs), tuple(outputs), sig)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"receipt names a bad peer id: {exc}") from None


def _fields(data: bytes, count: int, what: str) -> list:
    """A msgpack list of ``count`` fields (untrusted input: ValueError otherwise)."""
    if not isinstance(data, bytes) or len(data) > MAX_EVIDENCE:
        raise ValueError(f"{what} is not bytes of a sane size")
    try:
        o = msgpack.unpackb(data, raw=False)
    except Exception as exc:
        raise ValueError(f"{what} is not msgpack: {exc}") from None
    if not isinstance(o, list) or len(o) != count:
        raise ValueError(f"{what} has the wrong number of fields")
    return o


def params_digest(params: bytes) -> bytes:
    return hashlib.sha256(params).digest()


def input_ids(args: list[Any]) -> list[bytes]:
    """Content addresses of a task's arguments as they travelled (by id, or inline)."""
    return [a.oid if a.oid is not None else object_id(a.array).raw for a in args]


def output_ids(outputs: list[np.ndarray]) -> list[bytes]:
    """Content addresses of a task's results as they travel."""
    return [object_id(o).raw for o in outputs]


@dataclass(frozen=True, slots=True)
class Evidence:
    """A rejected result, re-checkable by anyone holding the arrays it names."""

    receipt: Receipt
    """The accused worker's signed receipt."""
    params: bytes
    """The task's msgpack parameters (their digest is in the receipt)."""
    reason: str = ""
    """The reporter's words (not evidence of anything)."""

    def encode(self) -> bytes:
        return msgpack.packb([self.receipt.encode(), self.params, cut_reason(self.reason)],
                             use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes) -> Evidence:
        """Parse encoded evidence; ValueError when malformed."""
        o = _fields(data, 3, "evidence")
        if (not isinstance(o[0], bytes)
                or not isinstance(o[1], bytes) or len(o[1]) > MAX_PARAMS
                or not isinstance(o[2], str)):
            raise ValueError("evidence fields have the wrong types")
        return cls(Receipt.decode(o[0]), o[1], cut_reason(o[2]))

    @property
    def key(self) -> bytes:
        """One id per receipt: the same evidence counts once, however often it arrives."""
        return hashlib.sha256(self.receipt.signed_part()).digest()


@dataclass(frozen=True, slots=True)
class Finding:
    """What :func:`check_evidence` found."""

    kind: str
    """"proven", "correct" or "unproven" (module docstring)."""
    why: str
    """In words, for logs."""

    @property
    def proven(self) -> bool:
        return self.kind == "proven"


def check_evidence(evidence: Evidence,
                   fetch_array: Callable[[bytes], np.ndarray | None]) -> Finding:
    """Re-check ``evidence`` with arrays from ``fetch_array(content address)``.

    Every array is checked against its address (``fetch_array`` may return anything), then
    the result is re-verified here. Never raises on bad evidence: it is ``unproven``.
    """
    r = evidence.receipt
    if not r.valid():
        return Finding("unproven", "the receipt's signature is not the worker's")
    if params_digest(evidence.params) != r.params:
        return Finding("unproven", "the parameters do not match the receipt")
    kind = (r.actor, r.method)
    if kind not in (("matmul", "matmul"), ("llama_span", "forward"), ("minilm", "forward"),
                    ("mlp", "grad")) \
            or len(r.inputs) != 2 \
            or len(r.outputs) != 1:
        return Finding("unproven", f"{r.actor}.{r.method} results cannot be re-checked here")
    arrays = []
    for oid in (*r.inputs, *r.outputs):
        arr = fetch_array(oid)
        if not isinstance(arr, np.ndarray) or object_id(arr) != ObjectId(oid):
            return Finding("unproven", f"array {oid[:6].hex()} is missing or does not match "
                                       "its address")
        arrays.append(wire.restore_precision(arr) if wire.precision_of(arr) else arr)
    if kind == ("llama_span", "forward"):
        return _check_span(r, evidence.params, *arrays)
    if kind == ("minilm", "forward"):
        return _check_minilm(r, evidence.params, *arrays)
    if kind == ("mlp", "grad"):
        return _check_mlp(r, evidence.params, *arrays)
    a, b, c = arrays
    try:
        params = msgpack.unpackb(evidence.params, raw=False) if evidence.params else {}
        if not isinstance(params, dict):
            raise ValueError("parameters are not a map")
        check_matmul([a, b], params)
        precision = params.get("precision", "f32")
        if not isinstance(c, np.ndarray) or c.shape != (a.shape[0], b.shape[1]):
            return Finding("proven", f"{r.worker.short()} signed a result of the wrong shape")
        a, b = check_operands(a, b)
        with contextlib.suppress(compute.InvalidInput), \
                np.errstate(over="ignore", invalid="ignore"):  # overflows f32: judged below
            if compute.verify_matmul(a, b, c, precision=precision):
                return Finding("correct", "the signed result is right: the report was false")
        wrong = _beyond_worst_case(a, b, np.asarray(c, np.float64), precision)
    except (ValueError, TypeError, compute.InvalidInput) as exc:
        return Finding("unproven", f"the inputs are not a valid matmul: {exc}")
    if wrong is None:
        return Finding("unproven", "every suspect element is within what some honest "
                                   "backend can produce for these inputs (rounding in any "
                                   "order, overflow, flushed subnormals, f16)")
    return Finding("proven", f"{r.worker.short()} signed a wrong matmul result ({wrong})")


def _check_span(r: Receipt, packed: bytes, x: np.ndarray, flat: np.ndarray, trace: Any
                ) -> Finding:
    """A span's trace (models.span) claims, for every layer, each product's input and output:
    each pair is judged as a matmul the worker signed (the weight is the bundle's, named by
    its content address in the receipt). The first product beyond every honest rounding
    proves the lie; the non-linear steps between them prove nothing here (the requester
    recomputes those itself and never uses a worker's)."""
    try:
        params = msgpack.unpackb(packed, raw=False) if packed else {}
        if not isinstance(params, dict):
            raise ValueError("parameters are not a map")
        check_span_forward([x, flat], params)
        c = SpanConfig.parse(params["config"])
        count = params["count"]
        width = llama_span.layer_width(c)
        if not isinstance(trace, np.ndarray) or trace.dtype != np.float32 \
                or trace.shape != (x.shape[0], count * width):
            return Finding("proven", f"{r.worker.short()} signed a trace of the wrong shape")
        layers = llama_span.unbundle(flat, c, count)
    except (ValueError, TypeError) as exc:
        return Finding("unproven", f"the inputs are not a valid span call: {exc}")
    cols = llama_span.trace_columns(c)
    for j, layer in enumerate(layers):
        for part in llama_span.PARTS:
            lo, hi = cols[llama_span.INPUT_OF[part]]
            a = np.ascontiguousarray(trace[:, j * width + lo:j * width + hi])
            lo, hi = cols[part]
            out = np.ascontiguousarray(trace[:, j * width + lo:j * width + hi])
            b = np.ascontiguousarray(layer.matrices[part].dequantize().T)  # [in, out]
            with contextlib.suppress(compute.InvalidInput), \
                    np.errstate(over="ignore", invalid="ignore"):
                if compute.verify_matmul(a, b, out):
                    continue
            wrong = _beyond_worst_case(a, b, out.astype(np.float64), "f32")
            if wrong is not None:
                return Finding("proven", f"{r.worker.short()} signed a wrong product in layer "
                                         f"{params['first'] + j} {part} ({wrong})")
    return Finding("unproven", "every product in the trace is within what some honest "
                               "backend can produce for its recorded input")


def _check_minilm(r: Receipt, packed: bytes, x: np.ndarray, flat: np.ndarray, trace: Any
                  ) -> Finding:
    """A MiniLM trace (models.minilm_span) claims every product's output for the pass over
    ``x``: each product's input is what the pass computes from ``x`` and the outputs before
    it, here as on the requester. The first output beyond every honest rounding of its input
    times its weight proves the lie."""
    from models import minilm_span
    from models.minilm import run_layers

    try:
        params = msgpack.unpackb(packed, raw=False) if packed else {}
        if not isinstance(params, dict):
            raise ValueError("parameters are not a map")
        check_minilm_forward([x, flat], params)
        if not params.get("trace", True):
            raise ValueError("the call asked for no trace")
        lengths = minilm_span.check_lengths(params["lengths"], x.shape[0])
        layers = minilm_span.unbundle(flat)
    except (ValueError, TypeError) as exc:
        return Finding("unproven", f"the inputs are not a valid minilm call: {exc}")
    tokens = x.shape[0]
    if not isinstance(trace, np.ndarray) or trace.dtype != np.float32 \
            or trace.shape != (tokens * minilm_span.TRACE_WIDTH,):
        return Finding("proven", f"{r.worker.short()} signed a trace of the wrong shape")
    blocks = minilm_span.trace_blocks(trace, tokens)

    class _Wrong(Exception):
        pass

    def products(j: int, part: str, a: np.ndarray) -> np.ndarray:
        out = blocks[j][part]
        b = getattr(layers[j], part).array
        with contextlib.suppress(compute.InvalidInput), \
                np.errstate(over="ignore", invalid="ignore"):
            if compute.verify_matmul(a, b, out):
                return out
        wrong = _beyond_worst_case(a, b, out.astype(np.float64), "f32")
        if wrong is not None:
            raise _Wrong(f"layer {j} {part} ({wrong})")
        return out

    try:
        with np.errstate(over="ignore", invalid="ignore"):
            run_layers(layers, np.ascontiguousarray(x, np.float32), lengths, products)
    except _Wrong as exc:
        return Finding("proven", f"{r.worker.short()} signed a wrong product in {exc}")
    return Finding("unproven", "every product in the trace is within what some honest "
                               "backend can produce for the input the pass gives it")


def _check_mlp(r: Receipt, packed: bytes, x: np.ndarray, flat: np.ndarray, trace: Any
               ) -> Finding:
    """A training block's trace (models.mlp) claims every product's output for the pass over
    the block: each product's input is what the pass computes from ``x``, the labels and the
    outputs before it, here as on the trainer. The first output beyond every honest rounding
    of its input times its weight proves the lie. The softmax gradient is the one input an
    honest backend may compute a little differently (another exp): the two products it feeds
    are judged with :data:`models.mlp.SOFTMAX_SLACK` on each of its elements."""
    from models import mlp

    try:
        params = msgpack.unpackb(packed, raw=False) if packed else {}
        if not isinstance(params, dict):
            raise ValueError("parameters are not a map")
        sizes = mlp.check_grad_call([x, flat], params)
        y = mlp.check_labels(params["labels"], x.shape[0], sizes[-1])
        precision = params.get("precision", "f32")
    except (ValueError, TypeError) as exc:
        return Finding("unproven", f"the inputs are not a valid mlp call: {exc}")
    size = mlp.trace_size(sizes, x.shape[0])
    if not isinstance(trace, np.ndarray) or trace.dtype != np.float32 or trace.shape != (size,):
        return Finding("proven", f"{r.worker.short()} signed a trace of the wrong shape")
    views = mlp.trace_views(trace, sizes, x.shape[0])
    last = len(sizes) - 2

    class _Wrong(Exception):
        pass

    def products(kind: str, layer: int, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        out = views[(kind, layer)]
        a, b = ((left, right) if kind == "z" else (np.ascontiguousarray(left.T), right)
                if kind == "dw" else (left, np.ascontiguousarray(right.T)))
        if precision == "f32":
            with contextlib.suppress(compute.InvalidInput), \
                    np.errstate(over="ignore", invalid="ignore"):
                if compute.verify_matmul(a, b, out):
                    return out
        soft = layer == last and kind != "z"   # fed by the softmax gradient
        extra_a = np.float64(mlp.SOFTMAX_SLACK) if soft and kind == "da" else None
        extra_b = np.float64(mlp.SOFTMAX_SLACK) if soft and kind == "dw" else None
        wrong = _beyond_worst_case(a, b, out.astype(np.float64), "f32", extra_a, extra_b,
                                   rounded_to=precision)
        if wrong is not None:
            raise _Wrong(f"layer {layer} {kind} ({wrong})")
        return out

    try:
        with np.errstate(over="ignore", invalid="ignore"):
            mlp.run_block(flat, sizes, np.ascontiguousarray(x, np.float32), y, products)
    except _Wrong as exc:
        return Finding("proven", f"{r.worker.short()} signed a wrong product in {exc}")
    return Finding("unproven", "every product in the trace is within what some honest "
                               "backend can produce for the input the pass gives it")


MAX_SUSPECT_ROWS = 32
"""Rows re-computed exactly when judging evidence (non-finite ones first, then those
Freivalds flags)."""
_FLT_MAX = float(np.finfo(np.float32).max)
_FLT_MIN = 2.0**-126
"""Smallest normal f32: a GPU may flush anything below it to zero, inputs and results."""
_F16_MIN = 2.0**-14
"""Smallest normal f16 (a GPU may flush f16 subnormals too)."""
_F16_MAX = 65504.0
"""Largest finite f16: from halfway to the next step (65520) an honest rounding is inf."""


def _rounded_inputs(x: np.ndarray, x_abs: np.ndarray, precision: str
                    ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(how far an honest backend's copy of ``x`` may be from it, where that copy may be
    infinite), float64; None for none at all. ``x_abs`` is ``|x|`` in float64. f32:
    subnormals may be flushed. f16: numpy rounds to nearest even (wgpu_backend's casts),
    and f16 subnormals may be flushed in turn."""
    if precision != "f16":
        sub = (x_abs < _FLT_MIN) & (x_abs > 0)
        return (np.where(sub, x_abs, 0.0) if sub.any() else None), None
    with np.errstate(over="ignore"):
        r = x.astype(np.float16).astype(np.float64)
    inf = ~np.isfinite(r)
    r = np.where(inf, 0.0, r)
    d = np.abs(r - x_abs * np.sign(x)) + np.where(np.abs(r) < _F16_MIN, np.abs(r), 0.0)
    return np.where(inf, 0.0, d), (inf if inf.any() else None)


def _beyond_worst_case(a: np.ndarray, b: np.ndarray, c: np.ndarray, precision: str,
                       extra_a: Any = None, extra_b: Any = None, rounded_to: str = "f32"
                       ) -> str | None:
    """An element of ``c`` that no honest product can produce, in words, or None.

    Freivalds' threshold is a *probabilistic* rounding model, and a requester can craft
    inputs that push an honest result past it (issue 34): a large partial sum that absorbs
    many small terms, an exact value over FLT_MAX (the honest f32 result is inf), products
    that underflow or subnormals a GPU flushes to zero, f16 inputs over 65504 or below its
    normal range. Blocking needs more, judged exactly on the flagged rows (float64, whose
    own rounding is charged too): the honest backend's inputs lie within ``da``/``db`` of
    the sent ones (:func:`_rounded_inputs`), it sums in f32 in any order, with FMA or not,
    so a finite honest element is within::

        |a| db + da (|b| + db) + gamma_K (|a| + da)(|b| + db) + 4 K FLT_MIN

    of the exact one (``gamma_K = K u / (1 - K u)``, Higham; the last term is underflow
    and flushing, one FLT_MIN per operation). ``extra_a``/``extra_b``: how much farther
    (absolute, broadcast over the operand) an honest backend's own input may be from the one
    given, where it computes that input itself (models.mlp's softmax gradient).
    ``rounded_to``: the result was rounded to f16 or bf16 after it was computed, so each
    honest element may be off by that format's unit roundoff times its size (plus the
    format's smallest normal, for a flushed subnormal) on top. A finite element beyond that is a lie. A
    non-finite element is a lie when no partial sum of any order can reach FLT_MAX (an
    overflow is the only way finite inputs give inf or NaN) and no input rounds to inf;
    otherwise it proves nothing.
    """
    m, k = a.shape
    if k * 2.0**-24 >= 0.5:
        return None
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return None
    gamma = k * 2.0**-24 / (1 - k * 2.0**-24)
    slack = 1.0 + 8 * (k + 2) * 2.0**-53   # the float64 sums below, each of >= 0 terms
    finite_c = np.isfinite(c)
    with np.errstate(over="ignore", invalid="ignore"):
        r = draw_vectors(b.shape[1], ROUNDS)
        residual = np.abs(residuals(a, b, np.where(finite_c, c, 0).astype(np.float32), r))
    rank = np.nan_to_num(residual.max(axis=1), nan=np.inf, posinf=np.inf)
    rank[~finite_c.all(axis=1)] = np.inf       # rows with a NaN or inf come first
    rows = np.argsort(-rank, kind="stable")[:MAX_SUSPECT_ROWS]
    a64, b64 = a[rows].astype(np.float64), b.astype(np.float64)
    exact = a64 @ b64
    a_abs, b_abs = np.abs(a64, out=a64), np.abs(b64, out=b64)   # (no more copies of b)
    da, a_inf = _rounded_inputs(a[rows], a_abs, precision)
    db, b_inf = _rounded_inputs(b, b_abs, precision)
    if extra_a is not None:
        da = np.broadcast_to(extra_a, a_abs.shape) + (0.0 if da is None else da)
    if extra_b is not None:
        db = np.broadcast_to(extra_b, b_abs.shape) + (0.0 if db is None else db)
    plain = a_abs @ b_abs
    if da is None and db is None:             # every input as sent (f32, no subnormal)
        reach, spread = plain, 0.0
    else:
        a_up = a_abs if da is None else a_abs + da
        b_up = b_abs if db is None else b_abs + db
        reach = a_up @ b_up                   # what any honest partial sum is made of
        spread = (0.0 if db is None else a_abs @ db) + (0.0 if da is None else da @ b_up)
    bound = (spread + gamma * reach) * slack + 4 * k * _FLT_MIN \
        + 4 * (k + 2) * 2.0**-53 * plain      # the float64 exact product's own rounding
    may_overflow = (1 + gamma) * reach * slack + 4 * k * _FLT_MIN >= _FLT_MAX
    if rounded_to != "f32":
        unit, tiny = {"f16": (2.0**-11, _F16_MIN), "bf16": (2.0**-8, _FLT_MIN)}[rounded_to]
        bound = bound + unit * (np.abs(exact) + bound) * slack + tiny
        if rounded_to == "f16":   # an honest value past f16's range rounds to infinity
            may_overflow = may_overflow | ((np.abs(exact) + bound) * slack >= _F16_MAX)
    inf_input = np.zeros(exact.shape, bool)
    if a_inf is not None:
        inf_input |= a_inf.any(axis=1)[:, None]
    if b_inf is not None:
        inf_input |= b_inf.any(axis=0)[None, :]
    claimed = c[rows]
    finite = np.isfinite(claimed)
    excess = np.where(finite, np.abs(np.where(finite, claimed, 0.0) - exact) * (1 - 2.0**-52)
                      - bound, np.inf)
    # an honest overflow gives inf or NaN; an input rounded to inf gives anything
    excess[(may_overflow & ~finite) | inf_input] = -np.inf
    if not np.any(excess > 0):
        return None
    i, j = np.unravel_index(int(np.argmax(excess)), excess.shape)
    return (f"element ({int(rows[i])}, {int(j)}) is {float(claimed[i, j])!r}, exactly "
            f"{float(exact[i, j])!r}, worst-case rounding {float(bound[i, j]):.3g}")


KEEP_SECONDS = 600.0
"""How long a requester keeps evidence it delivered (a coordinator's ``liar_window``)."""


@dataclass
class _Kept:
    item: Any
    nbytes: int
    at: float
    coordinators: set[PeerId] = dataclasses.field(default_factory=set)


class DeliveredEvidence:
    """Evidence this requester delivered, per accused worker, so that a coordinator that
    takes over hears all of it.

    A block takes ``liar_threshold`` distinct pieces at one coordinator, and a coordinator
    keeps its count in memory: in `swarm demo` one piece went to the coordinator of term 2,
    the next to that of term 3 (a handoff), and the liar stayed unblocked for more jobs.
    Each new coordinator judges every piece itself (it takes no predecessor's word), and
    counts a piece once however often it comes. Bounded: ``per_worker`` pieces for each of
    ``workers`` accused, ``max_bytes`` of arrays (references to the jobs' arrays, kept alive
    here), each for :data:`KEEP_SECONDS`."""

    def __init__(self, per_worker: int = 4, workers: int = 64, max_bytes: int = 256 << 20,
                 keep_s: float = KEEP_SECONDS) -> None:
        self.per_worker, self.workers = per_worker, workers
        self.max_bytes, self.keep_s = max_bytes, keep_s
        self._kept: dict[PeerId, dict[bytes, _Kept]] = {}  # least recently accused first

    def delivered(self, worker: PeerId, key: bytes, item: Any, nbytes: int,
                  coordinator: PeerId, now: float) -> list[Any]:
        """``coordinator`` took the piece ``key`` (``item``, holding ``nbytes`` of arrays)
        against ``worker``; returns the earlier pieces against ``worker`` that it has not
        had (to deliver to it too)."""
        kept = {k: v for k, v in self._kept.pop(worker, {}).items() if now - v.at < self.keep_s}
        entry = kept.setdefault(key, _Kept(item, nbytes, now))  # first delivered first
        entry.coordinators.add(coordinator)
        while len(kept) > self.per_worker:
            kept.pop(next(iter(kept)))
        self._kept[worker] = kept
        while len(self._kept) > self.workers:
            self._kept.pop(next(iter(self._kept)))
        while self.held_bytes > self.max_bytes and self._drop_oldest():
            pass
        return [e.item for e in self._kept.get(worker, {}).values()
                if coordinator not in e.coordinators]

    @property
    def held_bytes(self) -> int:
        return sum(e.nbytes for kept in self._kept.values() for e in kept.values())

    def _drop_oldest(self) -> bool:
        oldest = min(((e.at, w, k) for w, kept in self._kept.items() for k, e in kept.items()),
                     default=None)
        if oldest is None:
            return False
        _, worker, key = oldest
        del self._kept[worker][key]
        if not self._kept[worker]:
            del self._kept[worker]
        return True
