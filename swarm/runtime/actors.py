"""Actor classes a worker hosts, and the per-actor ordering of calls.

No code travels: a worker runs only actor classes installed in its :data:`REGISTRY` (the
built-in :class:`MatmulActor`, plus any a deployment registers before starting its node).
A requester names a class and a method; the same :class:`MethodSpec` validates the call's
arrays and parameters on the requester (a ValueError before anything is sent) and again on
the worker (a peer's request is untrusted input).

Calls to one actor instance run one at a time in the order the caller issued them
(:class:`CallOrder`): Ray's ordered delivery per actor handle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np

from models import span as llama_span

MAX_WGSL = 64 * 1024
MAX_DIM = 1 << 16
MAX_OUTPUT = 1 << 28
"""Largest matmul result in elements (1 GiB of float32, the wire's largest array)."""
ARRAY_DTYPES = ("float32", "float16", "float64", "int32", "uint32")


@dataclass(frozen=True, slots=True)
class MethodSpec:
    """What one actor method takes, checked on both ends."""

    name: str
    """Method name as sent on the wire."""
    check: Callable[[Sequence[np.ndarray], Mapping[str, Any]], None]
    """Raises ValueError/TypeError saying what is wrong with the arrays or parameters."""
    doc: str
    """One line for error messages and ``help``."""


def _require_2d_float(name: str, x: np.ndarray) -> None:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(x).__name__}")
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {x.shape}; reshape it first")
    if x.dtype not in (np.float32, np.float16, np.float64):
        raise ValueError(f"{name} has dtype {x.dtype}; use float32 (or float16/float64, which "
                         "are converted to float32 for compute)")
    if max(x.shape) > MAX_DIM or 0 in x.shape:
        raise ValueError(f"{name} has shape {x.shape}; each dimension must be 1..{MAX_DIM}")


def check_matmul(arrays: Sequence[np.ndarray], params: Mapping[str, Any]) -> None:
    if len(arrays) != 2:
        raise TypeError(f"matmul takes 2 arrays (a, b), got {len(arrays)}")
    a, b = arrays
    _require_2d_float("a", a)
    _require_2d_float("b", b)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul shapes do not chain: a is {a.shape}, b is {b.shape}; "
                         f"a's columns ({a.shape[1]}) must equal b's rows ({b.shape[0]})")
    if a.shape[0] * b.shape[1] > MAX_OUTPUT:
        raise ValueError(f"the result would be {a.shape[0]}x{b.shape[1]}; at most "
                         f"{MAX_OUTPUT} elements (split the job)")
    if set(params) - {"precision"}:
        raise TypeError(f"matmul takes only precision=, got {sorted(params)}")


def check_kernel(arrays: Sequence[np.ndarray], params: Mapping[str, Any]) -> None:
    extra = set(params) - {"wgsl", "inputs", "outputs", "dispatch"}
    if extra:
        raise TypeError(f"kernel takes wgsl=, inputs=, outputs=, dispatch=; got {sorted(extra)}")
    wgsl = params.get("wgsl")
    if not isinstance(wgsl, str) or not wgsl.strip():
        raise TypeError("kernel needs wgsl=<WGSL source string>")
    if len(wgsl.encode()) > MAX_WGSL:
        raise ValueError(f"WGSL source is over {MAX_WGSL} bytes")
    names = params.get("inputs", [])
    if (not isinstance(names, list | tuple) or len(names) != len(arrays)
            or not all(isinstance(n, str) and 0 < len(n) <= 64 for n in names)):
        raise ValueError(f"inputs= must name each of the {len(arrays)} arrays by its WGSL "
                         "buffer name, in order")
    outputs = params.get("outputs")
    if not isinstance(outputs, list | tuple) or not outputs:
        raise TypeError("kernel needs outputs=[(name, shape, dtype), ...] for the buffers to "
                        "read back")
    for spec in outputs:
        if (not isinstance(spec, list | tuple) or len(spec) != 3 or not isinstance(spec[0], str)
                or not isinstance(spec[1], list | tuple)
                or not all(isinstance(d, int) and 0 < d <= MAX_DIM * MAX_DIM for d in spec[1])
                or spec[2] not in ARRAY_DTYPES):
            raise ValueError(f"bad output spec {spec!r}: use (name, shape tuple, dtype name) "
                             f"with dtype one of {', '.join(ARRAY_DTYPES)}")
    dispatch = params.get("dispatch")
    if (not isinstance(dispatch, list | tuple) or len(dispatch) != 3
            or not all(isinstance(d, int) and 1 <= d <= 65535 for d in dispatch)):
        raise ValueError(f"dispatch must be 3 workgroup counts in 1..65535, got {dispatch!r}")
    for i, x in enumerate(arrays):
        if not isinstance(x, np.ndarray) or x.dtype.name not in ARRAY_DTYPES:
            raise ValueError(f"kernel input {i} must be a numpy array of "
                             f"{', '.join(ARRAY_DTYPES)}")


class MatmulActor:
    """Built-in actor: matmul shards and caller-supplied WGSL kernels on the worker's backend.

    State kept between calls: the compute backend (device, compiled pipelines, buffers).
    Kernels always run on wgpu (the worker's GPU, or llvmpipe), whatever runs its matmuls.
    """

    NAME = "matmul"
    METHODS = {
        "matmul": MethodSpec("matmul", check_matmul, "matmul(a, b) -> a @ b"),
        "kernel": MethodSpec("kernel", check_kernel,
                             "kernel(*arrays, wgsl=, inputs=[names], outputs=[(name, shape, "
                             "dtype)], dispatch=(x, y, z))"),
    }

    def __init__(self, backend: Any, kernels: Any = None) -> None:
        self.backend = backend
        self.kernels = kernels
        """A :class:`~swarm.runtime.kernels.KernelRunner` (a worker's: kernels it can stop);
        None runs them in this process (the requester's own checks)."""
        self._kernel_backend: Any = backend if getattr(backend, "name", "") == "wgpu" else None

    def matmul(self, arrays: Sequence[np.ndarray], params: Mapping[str, Any]) -> list[np.ndarray]:
        a, b = (np.asarray(x, dtype=np.float32) for x in arrays)
        return [self.backend.matmul(a, b, precision=params.get("precision", "f32"))]

    def kernel(self, arrays: Sequence[np.ndarray], params: Mapping[str, Any]) -> list[np.ndarray]:
        inputs = dict(zip(params.get("inputs", []), arrays, strict=True))
        outputs = {name: (tuple(shape), np.dtype(dtype))
                   for name, shape, dtype in params["outputs"]}
        if self.kernels is not None:
            outs = self.kernels.run(params["wgsl"], inputs, outputs, tuple(params["dispatch"]))
            return [outs[name] for name, _, _ in params["outputs"]]
        if self._kernel_backend is None:  # matmul may run on numpy; WGSL needs wgpu
            import compute

            self._kernel_backend = compute.get_backend("wgpu")
        outs = self._kernel_backend.run_kernel(
            params["wgsl"], inputs=inputs, outputs=outputs, dispatch=tuple(params["dispatch"]))
        return [outs[name] for name, _, _ in params["outputs"]]


class StaleCache(ValueError):
    """A span call that does not follow the cache this actor holds for a sequence (it was
    dropped, or never built): the requester rebuilds it from position 0. Answered as the
    task failure kind "stale", so a requester never reads the error's words."""


class MemoryFull(ValueError):
    """State an actor would keep for its requester does not fit the worker's ``--max-memory``
    (answered as "busy": run it elsewhere)."""


SPAN_MODEL_ID = 12
"""Bytes of the model's content address a span call may name (what the worker announces it
hosts: swarm.members.MODEL_ID)."""
MAX_SPAN_SEQS = 256
"""Sequences one span actor keeps caches for."""
MAX_SPAN_CACHE = 1 << 30
"""Bytes of keys and values one span actor keeps (over all its sequences)."""
_SPAN_CONFIG = {"d_model": (1, 8192), "d_ff": (1, 32768), "n_heads": (1, 256),
                "n_kv_heads": (1, 256), "context_length": (1, 1 << 16)}


@dataclass(frozen=True)
class SpanConfig:
    """The shape facts a span needs (the fields of models.gguf_weights.LlamaConfig it reads)."""

    d_model: int
    d_ff: int
    n_heads: int
    n_kv_heads: int
    context_length: int
    rope_base: float
    norm_eps: float
    rope_style: str = "norm"
    rope_scale: float = 1.0
    rope_freqs: tuple[float, ...] | None = None
    qkv_bias: bool = False

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def of(cls, config: Any) -> SpanConfig:
        return cls(*(getattr(config, f) for f in cls.__dataclass_fields__))

    def params(self) -> dict[str, Any]:
        out = {f: getattr(self, f) for f in self.__dataclass_fields__}
        out["rope_freqs"] = None if self.rope_freqs is None else list(self.rope_freqs)
        return out

    @classmethod
    def parse(cls, given: Any) -> SpanConfig:
        if not isinstance(given, dict) or set(given) != set(cls.__dataclass_fields__):
            raise ValueError(f"config= must be a map of {', '.join(cls.__dataclass_fields__)}")
        for name, (lo, hi) in _SPAN_CONFIG.items():
            v = given[name]
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise ValueError(f"config {name} must be an int in {lo}..{hi}")
        for name in ("rope_base", "norm_eps"):
            v = given[name]
            if not isinstance(v, float | int) or isinstance(v, bool) or not 0 < v < 1e12:
                raise ValueError(f"config {name} must be a positive number")
        if given["d_model"] % given["n_heads"] or given["n_heads"] % given["n_kv_heads"] \
                or (given["d_model"] // given["n_heads"]) % 2:
            raise ValueError("config: heads must divide d_model (even head size) and KV heads "
                             "the heads")
        if given["rope_style"] not in ("norm", "neox"):
            raise ValueError("config rope_style must be 'norm' or 'neox'")
        if not isinstance(given["qkv_bias"], bool):
            raise ValueError("config qkv_bias must be true or false")
        v = given["rope_scale"]
        if not isinstance(v, float | int) or isinstance(v, bool) or not 0 < v <= 1e6:
            raise ValueError("config rope_scale must be a positive number")
        freqs = given["rope_freqs"]
        if freqs is not None:
            half = given["d_model"] // given["n_heads"] // 2
            if not isinstance(freqs, list | tuple) or len(freqs) != half or not all(
                    isinstance(f, float | int) and not isinstance(f, bool) and 0 < f < 1e12
                    for f in freqs):
                raise ValueError(f"config rope_freqs must be null or {half} positive numbers")
            freqs = tuple(float(f) for f in freqs)
        return cls(**{**given, "rope_freqs": freqs})


def _int(v: Any, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def check_span_forward(arrays: Sequence[np.ndarray], params: Mapping[str, Any]) -> None:
    if len(arrays) != 2:
        raise TypeError(f"forward takes 2 arrays (x, bundle), got {len(arrays)}")
    extra = set(params) - {"first", "count", "config", "seqs", "drop", "model"}
    if extra:
        raise TypeError(f"forward takes first=, count=, config=, seqs=, drop=, model=; got "
                        f"{sorted(extra)}")
    model = params.get("model", b"")
    if not isinstance(model, bytes) or len(model) not in (0, SPAN_MODEL_ID):
        raise ValueError(f"model= is the first {SPAN_MODEL_ID} bytes of the model's content "
                         "address (or empty)")
    c = SpanConfig.parse(params.get("config"))
    count, first = params.get("count"), params.get("first")
    if not _int(count, 1, 256) or not _int(first, 0, 4096):
        raise ValueError("first= must be a layer index and count= 1..256 layers")
    x, flat = arrays
    _require_2d_float("x", x)
    if x.dtype != np.float32 or x.shape[1] != c.d_model:
        raise ValueError(f"x must be float32 [rows, {c.d_model}], got {x.dtype} {x.shape}")
    llama_span.bundle_sections(flat, c, count)  # its header and size (bytes from the network)
    seqs = params.get("seqs")
    if not isinstance(seqs, list) or not 1 <= len(seqs) <= MAX_SPAN_SEQS or not all(
            isinstance(s, list) and len(s) == 3 and _int(s[0], 0, (1 << 63) - 1)
            and _int(s[1], 0, c.context_length - 1) and _int(s[2], 1, c.context_length - s[1])
            for s in seqs):
        raise ValueError(f"seqs= must list 1..{MAX_SPAN_SEQS} [sequence id, first position, "
                         "rows] within the context")
    if len({s[0] for s in seqs}) != len(seqs) or sum(s[2] for s in seqs) != x.shape[0]:
        raise ValueError("seqs= must name each sequence once and cover x's rows")
    drop = params.get("drop", [])
    if not isinstance(drop, list) or len(drop) > MAX_SPAN_SEQS \
            or not all(_int(d, 0, (1 << 63) - 1) for d in drop):
        raise ValueError(f"drop= must list at most {MAX_SPAN_SEQS} sequence ids")
    if x.shape[0] * count * llama_span.layer_width(c) > MAX_OUTPUT:
        raise ValueError("the trace would be too large: send fewer rows")


class LlamaSpanActor:
    """Built-in actor: a span of Llama blocks (models.span) with each sequence's keys and
    values kept between calls. Weights come as one bundle by content address (sent once,
    kept in the worker's store); activations travel; every call answers with the span's
    trace, which the requester checks (swarm.spans)."""

    NAME = "llama_span"
    METHODS = {
        "forward": MethodSpec("forward", check_span_forward,
                              "forward(x, bundle, first=, count=, config={...}, "
                              "seqs=[[id, position, rows]], drop=[id]) -> trace"),
    }

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.config: SpanConfig | None = None
        self.caches: dict[int, llama_span.KVCache] = {}
        self.budget: Any = None
        """The worker's memory (``reserve(n) -> bool``, ``release(n)``: its object store,
        set by the host): every cache byte is reserved there before it is allocated, so
        the caches of all instances and requesters together stay within ``--max-memory``."""
        self.held = 0
        """Bytes reserved in ``budget`` for this actor's caches."""
        self.hosting: tuple[bytes, int, int] | None = None
        """(model id, first block, count) of the span it last ran (announced, for
        ``swarm status``; the model id is the requester's word)."""
        self._unbundled: tuple[np.ndarray, list[llama_span.Layer]] | None = None
        """The last bundle called with and its layers (views of it: made once, ~1 ms)."""

    def _hold(self, nbytes: int) -> None:
        """Reserve or release so that ``nbytes`` are held for the caches."""
        if self.budget is None:
            return
        if nbytes > self.held and not self.budget.reserve(nbytes - self.held):
            raise MemoryFull(f"span caches of {nbytes} bytes do not fit this worker's "
                             "--max-memory beside what it holds: run the span elsewhere")
        if nbytes < self.held:
            self.budget.release(self.held - nbytes)
        self.held = nbytes

    def close(self) -> None:
        """The instance is forgotten: its caches are no longer held."""
        self.caches.clear()
        self._unbundled = None
        self._hold(0)

    def forward(self, arrays: Sequence[np.ndarray], params: Mapping[str, Any],
                shift: int = 0) -> list[np.ndarray]:
        c = SpanConfig.parse(params["config"])
        if self.config is not None and c != self.config:
            raise ValueError("this span actor was started with another model's config")
        self.config = c
        x, flat = arrays
        count = params["count"]
        if self._unbundled is None or self._unbundled[0] is not flat \
                or len(self._unbundled[1]) != count:
            # views: the blocks stay as sent, multiplied by the file's kernels (models.quant)
            self._unbundled = (flat, llama_span.unbundle(flat, c, count))
        layers = self._unbundled[1]
        if shift:  # SWARM_CHAOS layer=P: a plausible wrong weight (another layer's)
            layers = layers[shift:] + layers[:shift] if count > 1 else [llama_span.Layer(
                layers[0].attn_norm, layers[0].ffn_norm,
                {p: type(m)(m.qtype, m.shape, np.roll(m.data, 1, axis=0))
                 for p, m in layers[0].matrices.items()})]
        for sid in params.get("drop", []):
            self.caches.pop(sid, None)
        # the caches' bytes after this call, reserved before any is allocated
        position = 2 * count * c.n_kv_heads * c.head_dim * 4
        after = {sid: cache.nbytes for sid, cache in self.caches.items()}
        alloc = 0  # new arrays this call makes (old ones live until it ends)
        for sid, begin, n in params["seqs"]:
            cache = self.caches.get(sid)
            if begin == 0:
                after[sid] = position * min(n, c.context_length)
                alloc += after[sid]
            elif cache is None or cache.length != begin or cache.layers != count:
                held = 0 if cache is None else cache.length
                raise StaleCache(f"sequence {sid}: this actor holds {held} positions, not "
                                 f"{begin}; send its rows from position 0")
            else:
                after[sid] = position * _grown(cache.capacity, begin + n, c.context_length)
                alloc += after[sid] if after[sid] > cache.nbytes else 0
        if sum(after.values()) > MAX_SPAN_CACHE or len(after) > MAX_SPAN_SEQS:
            raise ValueError(f"span caches are capped at {MAX_SPAN_SEQS} sequences and "
                             f"{MAX_SPAN_CACHE} bytes per actor: drop finished sequences")
        self._hold(self.held + alloc)
        try:
            fresh, seqs = {}, []
            for sid, begin, n in params["seqs"]:
                cache = self.caches.get(sid)
                if begin == 0:
                    cache = fresh[sid] = llama_span.KVCache(c, n, layers=count)
                seqs.append(llama_span.Seq.start(n, cache))
            products, trace = llama_span.traced_products(c, layers, x.shape[0])
            with _cpu_limit(self.backend):
                llama_span.run_layers(c, layers, np.asarray(x, np.float32), seqs, products)
            for s in seqs:
                s.cache.length = s.end
            self.caches.update(fresh)
            self.hosting = (params.get("model", b""), params["first"], count)
        finally:
            self._hold(sum(v.nbytes for v in self.caches.values()))
        return [trace]

    def forward_wrong_layer(self, arrays: Sequence[np.ndarray], params: Mapping[str, Any]
                            ) -> list[np.ndarray]:
        return self.forward(arrays, params, shift=1)


def _cpu_limit(backend: Any) -> AbstractContextManager[Any]:
    """The worker's ``--threads`` for a block of model work: its BLAS (``cpu_limit``) and the
    quantized kernels' split (models.quant.limit_threads)."""
    if backend is None:
        return nullcontext()
    from models import quant

    stack = ExitStack()
    stack.enter_context(backend.cpu_limit())
    stack.enter_context(quant.limit_threads(getattr(backend, "threads", None)))
    return stack


def _grown(capacity: int, need: int, context: int) -> int:
    """A KV cache's capacity once it holds ``need`` positions (models.span.KVCache doubles)."""
    while capacity < need:
        capacity *= 2
    return min(capacity, context)


def check_minilm_forward(arrays: Sequence[np.ndarray], params: Mapping[str, Any]) -> None:
    from models import minilm_span  # on first use: it loads numba (0.3 s of every start)

    if len(arrays) != 2:
        raise TypeError(f"forward takes 2 arrays (x, bundle), got {len(arrays)}")
    extra = set(params) - {"lengths", "trace"}
    if extra:
        raise TypeError(f"forward takes lengths=, trace=; got {sorted(extra)}")
    x, flat = arrays
    _require_2d_float("x", x)
    if x.dtype != np.float32 or x.shape[1] != minilm_span.DIM:
        raise ValueError(f"x must be float32 [tokens, {minilm_span.DIM}], got {x.dtype} "
                         f"{x.shape}")
    if not isinstance(flat, np.ndarray) or flat.dtype != np.float32 \
            or flat.shape != (minilm_span.bundle_size(),):
        raise ValueError(f"the bundle must be float32 [{minilm_span.bundle_size()}]")
    minilm_span.check_lengths(params.get("lengths"), x.shape[0])
    if not isinstance(params.get("trace", True), bool):
        raise ValueError("trace= must be true or false")
    if x.shape[0] * minilm_span.TRACE_WIDTH > MAX_OUTPUT:
        raise ValueError("the trace would be too large: send fewer tokens")


class MiniLMActor:
    """Built-in actor: all-MiniLM-L6-v2's six encoder layers over a batch of sentences
    (models.minilm_span). The weights come as one bundle by content address (sent once, kept
    in the worker's store); a call carries the batch's first-layer input and answers with the
    trace of every product (``trace=false``, for benchmarks only: the last hidden states),
    which the requester checks (swarm.embedding)."""

    NAME = "minilm"
    METHODS = {
        "forward": MethodSpec("forward", check_minilm_forward,
                              "forward(x, bundle, lengths=[tokens per sentence], trace=true) "
                              "-> trace"),
    }

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def forward(self, arrays: Sequence[np.ndarray], params: Mapping[str, Any],
                shift: int = 0) -> list[np.ndarray]:
        from models import minilm_span

        x, flat = arrays
        layers = minilm_span.unbundle(flat)
        if shift:  # SWARM_CHAOS layer=P: a plausible wrong weight (the next layer's)
            layers = layers[shift:] + layers[:shift]
        lengths = minilm_span.check_lengths(params["lengths"], x.shape[0])
        with self.backend.cpu_limit() if self.backend is not None else nullcontext():
            trace, hidden = minilm_span.traced(layers, np.asarray(x, np.float32), lengths)
        return [trace if params.get("trace", True) else hidden]

    def forward_wrong_layer(self, arrays: Sequence[np.ndarray], params: Mapping[str, Any]
                            ) -> list[np.ndarray]:
        return self.forward(arrays, params, shift=1)


def check_mlp_grad(arrays: Sequence[np.ndarray], params: Mapping[str, Any]) -> None:
    from models import mlp

    mlp.check_grad_call(arrays, dict(params))


class MLPActor:
    """Built-in actor: one block of an MLP's training step (models.mlp): the block's samples
    and the step's parameters (one bundle by content address, sent once a step) in, the trace
    of every product of the pass forward and backward out, which the trainer checks
    (swarm.training)."""

    NAME = "mlp"
    METHODS = {
        "grad": MethodSpec("grad", check_mlp_grad,
                           "grad(x, parameters, sizes=[widths], labels=[class per row], "
                           "precision=f32|f16|bf16) -> trace"),
    }

    def __init__(self, backend: Any, feed: Any = None) -> None:
        self.backend = backend
        self.feed = feed
        """A :class:`swarm.runtime.training_feed.TrainingFeed` told each block's loss and
        correct count (the node's status panel draws them), or None."""

    def grad(self, arrays: Sequence[np.ndarray], params: Mapping[str, Any]
             ) -> list[np.ndarray]:
        from models import mlp
        from swarm import wire

        x, flat = arrays
        sizes = mlp.check_sizes(params["sizes"])
        y = mlp.check_labels(params["labels"], x.shape[0], sizes[-1])
        precision = params.get("precision", "f32")
        with self.backend.cpu_limit() if self.backend is not None else nullcontext():
            trace, mine = mlp.traced_block(flat, sizes, np.asarray(x, np.float32), y,
                                           precision)
        if self.feed is not None:
            self.feed.record(mlp.spec_text(sizes), mine.rows, mine.loss, mine.correct)
        return [wire.cast_for_transfer(trace, precision)]  # exact: the values fit already


REGISTRY: dict[str, type] = {MatmulActor.NAME: MatmulActor,
                             LlamaSpanActor.NAME: LlamaSpanActor,
                             MiniLMActor.NAME: MiniLMActor,
                             MLPActor.NAME: MLPActor}

"""Actor classes this process can host or call, by name."""


def method_spec(actor: str, method: str) -> MethodSpec:
    """The spec for ``actor.method``; a ValueError naming what exists otherwise."""
    cls = REGISTRY.get(actor)
    if cls is None:
        raise ValueError(f"no actor class {actor!r} is installed; installed: "
                         f"{', '.join(sorted(REGISTRY))}")
    spec = cls.METHODS.get(method)
    if spec is None:
        raise AttributeError(f"actor {actor!r} has no method {method!r}; methods: "
                             f"{', '.join(sorted(cls.METHODS))}")
    return spec


class CallOrder:
    """Releases one actor's calls strictly in sequence order (sans-IO).

    ``offer(seq, call)`` returns the calls now runnable, in order. A seq already released is
    a duplicate (a retry of a call that did run): it is dropped and reported via ``stale``.
    """

    def __init__(self) -> None:
        self.next_seq = 0
        self._held: dict[int, Any] = {}
        self.stale = 0

    def offer(self, seq: int, call: Any) -> list[Any]:
        if seq < self.next_seq or seq in self._held:
            self.stale += 1
            return []
        self._held[seq] = call
        out = []
        while self.next_seq in self._held:
            out.append(self._held.pop(self.next_seq))
            self.next_seq += 1
        return out

    @property
    def held(self) -> int:
        """Calls waiting for an earlier one."""
        return len(self._held)

    def held_calls(self) -> list[Any]:
        """The calls waiting for an earlier one (to free what they hold)."""
        return list(self._held.values())

    def rewind(self, seq: int, released: dict[int, Any]) -> None:
        """Call ``seq`` could not run yet (its inputs must be resent): take it and the calls
        released after it back, so the resent ``seq`` runs first and order is kept."""
        self.next_seq = seq
        self._held.update({s: c for s, c in released.items() if s > seq})
