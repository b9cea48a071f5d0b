"""Synchronous data-parallel training over the swarm, every gradient checked.

Each step's batch is cut into blocks (:func:`models.mlp.blocks_of`: a function of the batch
alone). A block is one call of the ``mlp`` actor on a worker: it gets the block's samples and
labels and the step's parameters (one content-addressed array, sent to each worker once a
step), makes the pass forward and backward, and answers with the **trace** of its matrix
products. The trainer runs the same pass with its own non-linear steps (ReLU masks, softmax
cross-entropy, bias gradients), taking each product from the trace only after Freivalds'
check against its own input (:class:`models.mlp.TraceCheck`), so a block's gradient counts
only when every product in it is right.

The blocks of a step are one job of the requester's job engine (``Requester.run``, as every
matmul job): blocks are dealt by measured speed, a block late at its worker is copied to
another, a lost worker's blocks are redone, a worker that joins takes blocks from the next
step, and a block that fails its check is redone elsewhere while the worker's signed trace
goes to the node as evidence (judged exactly: swarm.runtime.evidence). With no worker the
requester computes the blocks itself.

The step's gradient is the sum of the blocks' gradients in block order, whoever computed
them: one worker, two, or none give the same curve (within float rounding of the products).

:class:`Trainer` is the sans-IO core (data order, SGD with momentum, history); :func:`train`
drives it with a ``compute`` function: :func:`local_compute` here, or :class:`SwarmCompute`.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from models import mlp
from models.data import Dataset, check_for_model

PRECISIONS = tuple(mlp.PRECISIONS)
MAX_EPOCHS = 100_000
MAX_BATCH = 1 << 16
STEP_TIMEOUT = 300.0
"""Seconds one step may take on the swarm before the training fails."""
SELF_CHECK_SLACK = 1.0
"""How far from ln(classes) a fresh model's mean loss may be (a backend that returns zeros,
or a broken init, is far outside: zeros give an exact ln(classes) only for the logits, and
the products' check refuses them first)."""

Block = tuple[np.ndarray, np.ndarray]
"""A block's samples (float32 [rows, features]) and labels (int64 [rows])."""
Compute = Callable[[np.ndarray, Sequence[Block]], list[mlp.BlockResult]]
"""``compute(parameters, blocks)``: each block's checked result, in block order."""


class SelfCheckFailed(RuntimeError):
    """A fresh model's loss is not finite or not near ln(classes): the backend is broken."""


@dataclass(frozen=True)
class TrainConfig:
    """What to train, and how; :meth:`check` says what is wrong, naming the field."""

    model: str = "mlp:784-128-10"
    epochs: int = 1
    batch: int = 64
    lr: float = 0.05
    momentum: float = 0.9
    seed: int = 0
    precision: str = "f32"

    def check(self) -> tuple[int, ...]:
        """The model's layer widths, or ValueError naming the bad field."""
        try:
            sizes = mlp.parse_spec(self.model)
        except ValueError as exc:
            raise ValueError(f"model: {exc}") from None
        for name, value, lo, hi in (("epochs", self.epochs, 1, MAX_EPOCHS),
                                    ("batch", self.batch, 1, MAX_BATCH),
                                    ("seed", self.seed, 0, (1 << 63) - 1)):
            if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
                raise ValueError(f"{name} must be an int from {lo} to {hi}, got {value!r}")
        check_lr(self.lr)
        if not isinstance(self.momentum, int | float) or isinstance(self.momentum, bool) \
                or not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got "
                             f"{self.precision!r}")
        return sizes


def check_lr(lr: object) -> float:
    if not isinstance(lr, int | float) or isinstance(lr, bool) or not math.isfinite(lr) \
            or not 0 < lr <= 100:
        raise ValueError(f"lr (learning rate) must be > 0 (and at most 100), got {lr!r}")
    return float(lr)


@dataclass
class Epoch:
    """One finished epoch."""

    epoch: int
    loss: float
    """Mean training loss over the epoch's samples (from the checked passes)."""
    accuracy: float
    """Training accuracy over the epoch (the model as it was at each step)."""
    seconds: float


@dataclass
class Progress:
    """Where a training run is (read from another thread: replaced, never mutated)."""

    step: int = 0
    steps: int = 0
    epoch: int = 0
    loss: float = float("nan")
    samples_per_s: float = 0.0


class Trainer:
    """The sans-IO core: data order, the parameters and SGD with momentum, the history.

    Each epoch visits the training samples in a shuffle seeded by (seed, epoch); a step's
    gradient is the mean over its batch of the per-sample gradients, the blocks' sums added
    in block order (float64, then float32)."""

    def __init__(self, config: TrainConfig, data: Dataset,
                 start: Checkpoint | None = None) -> None:
        self.config = config
        self.sizes = config.check()
        check_for_model(data, self.sizes)
        self.data = data
        self.resumed = start is not None
        """Started from a checkpoint (the self-check then runs a fresh model aside)."""
        self.first_epoch = 0 if start is None else start.epochs
        """Epochs done before this run (a resumed run numbers and shuffles on from there)."""
        self.params = (mlp.init_params(self.sizes, config.seed) if start is None
                       else np.array(start.params, np.float32))
        if self.params.shape != (mlp.param_count(self.sizes),):
            raise ValueError(f"the parameters do not fit {config.model}")
        self.velocity = (np.zeros_like(self.params) if start is None or start.velocity is None
                         else np.array(start.velocity, np.float32))
        self.lr = config.lr
        self.step = 0
        self.losses: list[float] = []
        """Each step's mean loss, in order (the curve)."""
        self.epochs: list[Epoch] = []
        self._epoch_loss = 0.0
        self._epoch_correct = 0
        self._epoch_seen = 0

    @property
    def steps_per_epoch(self) -> int:
        return -(-len(self.data.y) // self.config.batch)

    def batches(self, epoch: int) -> list[np.ndarray]:
        """The epoch's batches (indices into the training samples)."""
        order = np.random.default_rng([self.config.seed, epoch]).permutation(len(self.data.y))
        b = self.config.batch
        return [order[i:i + b] for i in range(0, len(order), b)]

    def blocks(self, batch: np.ndarray) -> list[Block]:
        x, y = self.data.x[batch], self.data.y[batch]
        return [(np.ascontiguousarray(x[s]), y[s]) for s in mlp.blocks_of(len(batch))]

    def apply(self, results: Sequence[mlp.BlockResult],
              updated: Callable[[np.ndarray, int, np.ndarray], None] | None = None) -> float:
        """Take one SGD step with the blocks' results (in block order); returns the batch's
        mean loss. ``updated(params, j, w)``: called right after layer ``j``'s weights ``w``
        are updated, while they are in cache (:meth:`SwarmCompute.prepare`)."""
        loss = 0.0
        correct = 0
        for r in results:
            loss += r.loss
            correct += r.correct
        n = sum(int(r.rows) for r in results)
        from models.mlp_loops import sgd_step

        at = 0
        for j, (w, b) in enumerate(mlp.unbundle(self.params, self.sizes)):
            for part, size in ((0, w.size), (1, b.size)):
                span = slice(at, at + size)
                sgd_step([r.grads[j][part] for r in results], n,
                                   self.config.momentum, self.lr, self.velocity[span],
                                   self.params[span])
                at += size
                if part == 0 and updated is not None:
                    updated(self.params, j, w)
        self.step += 1
        mean = loss / n
        self.losses.append(mean)
        self._epoch_loss += loss
        self._epoch_correct += correct
        self._epoch_seen += n
        return mean

    def end_epoch(self, epoch: int, seconds: float) -> Epoch:
        seen = max(self._epoch_seen, 1)
        e = Epoch(epoch, self._epoch_loss / seen, self._epoch_correct / seen, seconds)
        self.epochs.append(e)
        self._epoch_loss, self._epoch_correct, self._epoch_seen = 0.0, 0, 0
        return e

    def self_check(self, results: Sequence[mlp.BlockResult]) -> None:
        """Before the first step: a fresh model's mean loss must be finite and near
        ln(classes) (a backend that returns zeros or garbage is refused here)."""
        n = sum(r.rows for r in results)
        loss = sum(r.loss for r in results) / max(n, 1)
        want = math.log(self.sizes[-1])
        if not math.isfinite(loss) or abs(loss - want) > SELF_CHECK_SLACK:
            raise SelfCheckFailed(f"a fresh model's loss is {loss:.4f}, not near "
                                  f"ln({self.sizes[-1]}) = {want:.4f}: the backend is broken")

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Class indices for ``x`` (computed here)."""
        h = np.ascontiguousarray(x, np.float32)
        layers = mlp.unbundle(self.params, self.sizes)
        for j, (w, b) in enumerate(layers):
            h = h @ w + b
            if j < len(layers) - 1:
                h = np.maximum(h, 0)
        return h.argmax(axis=1)

    def test_accuracy(self) -> float:
        if not len(self.data.y_test):
            return float("nan")
        return float(np.mean(self.predict(self.data.x_test) == self.data.y_test))


def local_compute(sizes: Sequence[int], precision: str = "f32") -> Compute:
    """Every block computed here (the reference a swarm run must equal), the products
    rounded to ``precision`` as workers round them."""
    products = mlp.rounded_products(precision)

    def compute(params: np.ndarray, blocks: Sequence[Block]) -> list[mlp.BlockResult]:
        return [mlp.run_block(params, sizes, x, y, products) for x, y in blocks]

    return compute


@dataclass
class Control:
    """What another thread may change or read while a run goes on."""

    lr: float | None = None
    """A new learning rate, taken at the next step."""
    stop: threading.Event = field(default_factory=threading.Event)
    progress: Progress = field(default_factory=Progress)


def train(trainer: Trainer, compute: Compute, control: Control | None = None,
          on_step: Callable[[Progress], None] | None = None,
          on_epoch: Callable[[Epoch], None] | None = None) -> None:
    """Run ``trainer``'s remaining epochs with ``compute``; the first batch's results pass
    the self-check first."""
    control = control or Control()
    cfg = trainer.config
    total = trainer.steps_per_epoch * cfg.epochs
    checked = False
    first = trainer.first_epoch
    for epoch in range(first + len(trainer.epochs), first + cfg.epochs):
        started = time.perf_counter()
        seen = 0
        for batch in trainer.batches(epoch):
            if control.stop.is_set():
                return
            if control.lr is not None:
                trainer.lr, control.lr = control.lr, None
            blocks = trainer.blocks(batch)
            if not checked and trainer.resumed:  # a fresh model's first batch, aside
                trainer.self_check(compute(mlp.init_params(trainer.sizes, cfg.seed), blocks))
                checked = True
            results = compute(trainer.params, blocks)
            if not checked:
                trainer.self_check(results)
                checked = True
            loss = trainer.apply(results, getattr(compute, "prepare", None))
            seen += len(batch)
            control.progress = Progress(trainer.step, total, epoch + 1, loss,
                                        seen / max(time.perf_counter() - started, 1e-9))
            if on_step is not None:
                on_step(control.progress)
        e = trainer.end_epoch(epoch + 1, time.perf_counter() - started)
        if on_epoch is not None:
            on_epoch(e)


@dataclass
class RankTally:
    """One rank's part in a run."""

    samples: int = 0
    """Samples whose checked gradients it computed."""
    rejected: int = 0
    """Blocks it returned that failed the check."""
    failed: int = 0
    """Blocks it was given and did not answer (lost, late, refused)."""


class SwarmCompute:
    """A step's blocks as one job on the client's workers (module docstring)."""

    def __init__(self, client: Any, sizes: Sequence[int], precision: str = "f32",
                 timeout: float = STEP_TIMEOUT) -> None:
        self._client = client
        self.sizes = tuple(sizes)
        self.precision = precision
        self.timeout = timeout
        self.ranks: dict[str, RankTally] = {}
        self.check_seconds = 0.0
        """Thread time of the checks: each step's check vectors and fingerprints and each
        block's products' checks."""
        self.replay_seconds = 0.0
        """Thread time of the trainer's own steps in the blocks' replays (bias, ReLU,
        softmax, loss, bias gradients): what it computes for itself besides the checks."""
        self._lock = threading.Lock()
        self._next: list = []
        """The next step's layer checks (:meth:`prepare`), made of ``_next_for``."""
        self._next_for: np.ndarray | None = None

    def prepare(self, params: np.ndarray, j: int, w: np.ndarray) -> None:
        """The trainer just updated layer ``j``'s weights ``w`` (of ``params``): make the
        next step's check of that layer now, from the weights still in cache (a pass over
        them later, from memory, cost three times as much)."""
        t0 = time.thread_time()
        if j == 0:
            self._next, self._next_for = [], params
        self._next.append(mlp.layer_check(j, w))
        with self._lock:
            self.check_seconds += time.thread_time() - t0

    def _weights(self, params: np.ndarray, made: list | None) -> mlp.StepWeights:
        t0 = time.thread_time()
        step = mlp.StepWeights(params, self.sizes, made)
        with self._lock:
            self.check_seconds += time.thread_time() - t0
        return step

    def __call__(self, params: np.ndarray, blocks: Sequence[Block]) -> list[mlp.BlockResult]:
        made = self._next if params is self._next_for \
            and len(self._next) == len(self.sizes) - 1 else None
        self._next, self._next_for = [], None  # used once, for the parameters it was made of
        return self._client._loop.run(self._step(np.array(params, np.float32), blocks, made))

    async def _step(self, params: np.ndarray, blocks: Sequence[Block], made: list | None
                    ) -> list[mlp.BlockResult]:
        from swarm import wire
        from swarm.links import shm
        from swarm.runtime.objects import object_id
        from swarm.runtime.requester import Arg, Call

        req = self._client.node.requester
        sizes = self.sizes
        oid = object_id(params)
        req.store.put(params, oid)
        req.store.pin(oid)
        step = await asyncio.to_thread(self._weights, params, made)
        flops = 6.0 * sum(i * o for i, o in zip(sizes, sizes[1:], strict=False))
        calls = [Call("mlp", "grad", (Arg(x), Arg(params, oid)),
                      {"sizes": list(sizes), "labels": y.tolist(),
                       "precision": self.precision}, cost=flops * len(y))
                 for x, y in blocks]
        got: dict[tuple[int, int], mlp.BlockResult] = {}
        """(block, id of the answer's trace) -> its checked result: the job keeps one answer a
        block, and its result is the one of that very answer."""

        def check(i: int, trace: Any) -> bool:
            if not isinstance(trace, np.ndarray) or wire.precision_of(trace) != self.precision:
                return False  # not what was asked for (a wrong size fails below)
            shm.populate(trace)  # the mapping's page faults at once, as transport (not check)
            t0 = time.thread_time()
            wide = wire.restore_precision(trace) if self.precision != "f32" else trace
            try:
                result = mlp.check_block(step, blocks[i][0], blocks[i][1], wide,
                                         self.precision)
            except mlp.TraceMismatch:
                return False
            finally:
                with self._lock:
                    self.replay_seconds += time.thread_time() - t0
            with self._lock:
                self.check_seconds += result.check_seconds
                self.replay_seconds -= result.check_seconds
            got[(i, id(trace))] = result
            return True

        async def verify(i: int, outputs: list[np.ndarray]) -> bool:
            return len(outputs) == 1 and await asyncio.to_thread(check, i, outputs[0])

        def local(i: int) -> list[np.ndarray]:
            x, y = blocks[i]
            marker = np.empty(0, np.float32)
            got[(i, id(marker))] = mlp.run_block(params, sizes, x, y,
                                                 mlp.rounded_products(self.precision))
            return [marker]

        try:
            outputs, report = await req.run(calls, local=local, verify=verify,
                                            timeout=self.timeout)
        finally:
            req.store.unpin(oid)
        results = [got[(i, id(outs[0]))] for i, outs in enumerate(outputs)]
        rows = sum(len(y) for _, y in blocks) / len(blocks)
        for peer, r in report.peers.items():
            t = self.ranks.setdefault(peer, RankTally())
            t.samples += round(rows * (r.verified if peer != "local" else r.shards))
            t.rejected += r.rejected
            t.failed += r.failed
        return results


def check_data_for(config: TrainConfig, data: Dataset) -> tuple[int, ...]:
    """The config's sizes, checked against the data (ValueError naming the field)."""
    sizes = config.check()
    check_for_model(data, sizes)
    return sizes


@dataclass
class TrainResult:
    """What a finished run made (``as_json``: the ``--json`` object)."""

    test_accuracy: float
    epochs: list[Epoch]
    ranks: dict[str, RankTally]
    losses: list[float]
    seconds: float
    check_seconds: float
    """CPU seconds the trainer spent checking workers' products."""
    replay_seconds: float = 0.0
    """CPU seconds of the trainer's own non-linear steps in those replays."""

    @property
    def rejected(self) -> int:
        return sum(t.rejected for t in self.ranks.values())

    def as_json(self) -> dict[str, Any]:
        return {"test_accuracy": round(self.test_accuracy, 6),
                "epochs": [{"epoch": e.epoch, "loss": round(e.loss, 6),
                            "accuracy": round(e.accuracy, 6), "seconds": round(e.seconds, 3)}
                           for e in self.epochs],
                "ranks": [{"peer": p, "samples": t.samples, "rejected": t.rejected,
                           "failed": t.failed} for p, t in sorted(self.ranks.items())],
                "rejected": self.rejected, "steps": len(self.losses),
                "seconds": round(self.seconds, 3),
                "check_cpu_seconds": round(self.check_seconds, 3),
                "replay_cpu_seconds": round(self.replay_seconds, 3)}


class TrainJob:
    """A training run in a background thread: read its :attr:`history` and :attr:`progress`,
    change its learning rate (:meth:`set_lr`), wait for its :meth:`result`."""

    def __init__(self, trainer: Trainer, compute: Compute,
                 on_step: Callable[[Progress], None] | None = None) -> None:
        self.trainer = trainer
        self._compute = compute
        self._on_step = on_step
        self.control = Control()
        self._error: BaseException | None = None
        self._result: TrainResult | None = None
        self._thread = threading.Thread(target=self._run, name="swarm-train", daemon=True)

    def start(self) -> TrainJob:
        self._thread.start()
        return self

    def _run(self) -> None:
        started = time.perf_counter()
        try:
            train(self.trainer, self._compute, self.control, self._on_step)
            ranks = getattr(self._compute, "ranks", None)
            if ranks is None:
                ranks = {"local": RankTally(samples=len(self.trainer.data.y)
                                            * len(self.trainer.epochs))}
            self._result = TrainResult(self.trainer.test_accuracy(), list(self.trainer.epochs),
                                       dict(ranks), list(self.trainer.losses),
                                       time.perf_counter() - started,
                                       getattr(self._compute, "check_seconds", 0.0),
                                       getattr(self._compute, "replay_seconds", 0.0))
        except BaseException as exc:  # handed to whoever waits for the result
            self._error = exc

    @property
    def history(self) -> list[Epoch]:
        """The finished epochs."""
        return list(self.trainer.epochs)

    @property
    def losses(self) -> list[float]:
        """Each step's mean loss so far."""
        return list(self.trainer.losses)

    @property
    def progress(self) -> Progress:
        return self.control.progress

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` s for the run to end; whether it has."""
        self._thread.join(timeout)
        return self.done

    def set_lr(self, lr: float) -> None:
        """Use learning rate ``lr`` from the next step on."""
        self.control.lr = check_lr(lr)

    def stop(self) -> None:
        """Stop after the step under way (the result then has the epochs finished)."""
        self.control.stop.set()

    def result(self, timeout: float | None = None) -> TrainResult:
        """Wait for the run to end; its result, or the error that ended it."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"training did not finish within {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def save(self, path: str | Path) -> None:
        t = self.trainer
        save_model(path, Checkpoint(t.params, t.velocity, t.first_epoch + len(t.epochs)),
                   t.sizes)


@dataclass
class Checkpoint:
    """Where a run stands: enough to go on exactly as if it had not stopped."""

    params: np.ndarray
    velocity: np.ndarray | None
    """SGD's momentum (None: start it at zero)."""
    epochs: int
    """Epochs done."""


def save_model(path: str | Path, point: Checkpoint, sizes: Sequence[int]) -> None:
    """Write the parameters as safetensors (``w0``, ``b0``, ...: ``W`` is [in, out]; the
    momentum as ``vw0``, ``vb0``, ...) with the spec and the epochs done in the metadata,
    whole or not at all (a temporary file renamed)."""
    import os
    import tempfile

    from safetensors.numpy import save_file

    path = Path(path)
    tensors = {}
    for prefix, flat in (("", point.params), ("v", point.velocity)):
        if flat is None:
            continue
        for j, (w, b) in enumerate(mlp.unbundle(flat, sizes)):
            tensors[f"{prefix}w{j}"] = np.ascontiguousarray(w)
            tensors[f"{prefix}b{j}"] = np.ascontiguousarray(b)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp",
                               dir=path.parent if str(path.parent) else ".")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={"model": mlp.spec_text(sizes),
                                          "epochs": str(point.epochs)})
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_model(path: str | Path, sizes: Sequence[int]) -> Checkpoint:
    """What :func:`save_model` wrote for a model of ``sizes`` (the momentum when the file has
    it), or ValueError naming ``--resume``."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            if meta.get("model") != mlp.spec_text(sizes):
                raise ValueError(f"--resume: {path} holds {meta.get('model')!r}, not "
                                 f"{mlp.spec_text(sizes)}")
            epochs = meta.get("epochs", "0")
            if not epochs.isdigit() or int(epochs) > MAX_EPOCHS:
                raise ValueError(f"--resume: {path}: epochs {epochs[:20]!r} is not a count")
            names = set(f.keys())
            flats: list[np.ndarray | None] = []
            for prefix in ("", "v"):
                if prefix and f"{prefix}w0" not in names:
                    flats.append(None)
                    continue
                flat = np.zeros(mlp.param_count(sizes), np.float32)
                for j, (w, b) in enumerate(mlp.unbundle(flat, sizes)):
                    for name, view in ((f"{prefix}w{j}", w), (f"{prefix}b{j}", b)):
                        got = f.get_tensor(name)
                        if got.shape != view.shape:
                            raise ValueError(f"--resume: {path}: {name} is {got.shape}, not "
                                             f"{view.shape}")
                        view[...] = got
                if not np.isfinite(flat).all():
                    raise ValueError(f"--resume: {path} has NaN or infinite values")
                flats.append(flat)
    except (OSError, SafetensorError, KeyError) as exc:
        raise ValueError(f"--resume: cannot read {path}: {exc}") from None
    assert flats[0] is not None
    return Checkpoint(flats[0], flats[1], int(epochs))


def start(client: Any, data: Dataset, config: TrainConfig, resume: Checkpoint | None = None,
          on_step: Callable[[Progress], None] | None = None) -> TrainJob:
    """A :class:`TrainJob` on ``client``'s workers (``client`` None: here), started, going on
    from ``resume`` when given (``config.epochs`` more epochs)."""
    trainer = Trainer(config, data, resume)
    compute = (local_compute(trainer.sizes, config.precision) if client is None
               else SwarmCompute(client, trainer.sizes, config.precision))
    return TrainJob(trainer, compute, on_step).start()
