"""A GGUF model file as this project reads it: its content address, its metadata, its vocabulary
and a table of where each tensor's bytes lie, checked before anything uses them.

``gguf.GGUFReader`` parses every metadata value into its own small array: the vocabulary of a
chat model (50k-150k strings and merges) takes 6-13 s on this project's 2-core machines. So the
first open of a file writes what it read (JSON, no pickle) under the cache directory, named by
the file's BLAKE3 digest, and later opens read that instead. The digest itself (a full read of a
file that may be a gigabyte) is cached too, by the file's path, size, mtime and inode, so a
file is hashed once until it changes. What this module's older versions left there, and digests
of files gone or changed, are removed on the first open in a process (:func:`prune_cache`).

A file is refused with :class:`WeightsError` (a clear message, nothing written) when it is not
a GGUF, when it is truncated (a tensor's bytes reach past its end), when its architecture is not
one :mod:`models.archs` knows (the message names those it does), or when a tensor's type is not
one the weights can be kept in.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3
import numpy as np

CACHE_ENV = "SWARM_MODEL_CACHE"
"""Overrides where parsed headers and file digests are kept (default: the user cache)."""
CACHE_FORMAT = 3  # bump when what a cached header holds changes
_OWN_ENTRY = re.compile(r"[0-9a-f]{64}\.(?:h(\d+)\.json|v\d+)")
"""Names this module's versions have written under the cache root: ``<address>.h<N>.json``
(parsed headers) and ``<address>.v<N>`` (float32 ``.npy`` copies of the weights, from when
the weights were dequantized at load; nothing reads them now)."""
PARTIAL_AGE_S = 24 * 3600
"""A ``.partial-`` file (a write cut short) older than this is no one's write in progress."""
_pruned: set[Path] = set()
GGUF_MAGIC = b"GGUF"

SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
                   "Q4_K", "Q5_K", "Q6_K")
"""Tensor types the weights can be kept in (models.quant's blocks); others are refused by name."""


class WeightsError(RuntimeError):
    """The model file is missing, damaged, or not one this code knows how to run."""


class ModelMissing(WeightsError):
    """A known model whose file is not installed or assembled here (the message says how)."""


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor's bytes lie in the file. ``shape`` is numpy's order (rows first: a
    GGUF matrix is [out, in]); ``offset`` counts from the start of the file."""

    name: str
    qtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Vocabulary:
    """What the tokenizer, the chat template and the stop tokens are built from (the GGUF's
    ``tokenizer.*`` keys)."""

    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    bos_id: int
    eos_id: int
    chat_template: str
    pre: str
    model: str = "gpt2"
    add_bos: bool = False
    eot_id: int | None = None
    eom_id: int | None = None


@dataclass(frozen=True)
class ModelFile:
    """A checked GGUF: ``meta`` holds every scalar (and short list) metadata value by key."""

    path: Path
    address: str
    """BLAKE3 of the file's bytes (hex): the model's id everywhere."""
    meta: dict[str, Any]
    vocab: Vocabulary
    tensors: dict[str, TensorInfo]

    @property
    def architecture(self) -> str:
        return str(self.meta.get("general.architecture", ""))

    @property
    def name(self) -> str:
        """The display name: ``general.name``, else the file's name."""
        return str(self.meta.get("general.name") or self.path.stem)

    def arch_key(self, key: str, default: Any = ...) -> Any:
        """``{architecture}.{key}``; WeightsError when absent and no default is given."""
        return self.key(f"{self.architecture}.{key}", default)

    def key(self, key: str, default: Any = ...) -> Any:
        if key in self.meta:
            return self.meta[key]
        if default is ...:
            raise WeightsError(f"{self.path.name}: the file has no {key!r}")
        return default

    def data(self, name: str) -> np.ndarray:
        """The tensor's raw bytes (uint8, mapped from the file, read-only)."""
        t = self.tensors[name]
        return np.memmap(self.path, np.uint8, "r", offset=t.offset, shape=(t.nbytes,))


def cache_root() -> Path:
    if env := os.environ.get(CACHE_ENV):
        return Path(env)
    import platformdirs
    return Path(platformdirs.user_cache_dir("swarm")) / "models"


def open_file(path: Path | str) -> ModelFile:
    """The file, checked (module docstring); its header is parsed once per content address."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"{path}: no such model file")
    with path.open("rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise WeightsError(f"{path.name}: not a GGUF file (no GGUF magic at its start)")
    prune_cache()
    address = file_address(path)
    cached = cache_root() / f"{address}.h{CACHE_FORMAT}.json"
    try:
        head = json.loads(cached.read_text())
    except (OSError, ValueError):
        head = _read_header(path)
        _write_atomic(cached, json.dumps(head))
    tensors = {t["name"]: TensorInfo(t["name"], t["qtype"], tuple(t["shape"]), t["offset"],
                                     t["nbytes"]) for t in head["tensors"]}
    size = path.stat().st_size
    for t in tensors.values():
        if t.offset + t.nbytes > size:
            raise WeightsError(f"{path.name}: truncated: tensor {t.name} ends at byte "
                               f"{t.offset + t.nbytes}, the file has {size}")
    return ModelFile(path, address, head["meta"], Vocabulary(**head["vocab"]), tensors)


def file_address(path: Path) -> str:
    """BLAKE3 of the file, cached by path, size, mtime and inode (a changed file is rehashed)."""
    st = path.stat()
    key = f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}"
    entry = cache_root() / "addresses" / (blake3.blake3(key.encode()).hexdigest()[:32] + ".json")
    try:
        got = json.loads(entry.read_text())
        if got.get("key") == key and isinstance(got.get("address"), str):
            return got["address"]
    except (OSError, ValueError):
        pass
    address = hash_file(path)
    _write_atomic(entry, json.dumps({"key": key, "address": address}))
    return address


def prune_cache(root: Path | None = None) -> list[Path]:
    """Remove what nothing will read again from the cache (once per process and root):
    headers of another :data:`CACHE_FORMAT`, float32 weight copies of older versions
    (``<address>.v<N>``: half a gigabyte for SmolLM2), digests of files that are gone or have
    changed since (their key can never match again), and writes cut short a day ago. Anything
    else under the root (an assembled model file, wheels) is left alone. Returns what went."""
    root = cache_root() if root is None else root
    if root in _pruned:
        return []
    _pruned.add(root)
    gone: list[Path] = []

    def remove(p: Path) -> None:
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
            gone.append(p)
        except OSError:
            pass  # another process's sweep, or a read-only cache: harmless

    now = time.time()
    for folder in (root, root / "addresses"):
        try:
            entries = list(folder.iterdir())
        except OSError:
            continue
        for p in entries:
            if p.name.startswith(".partial-"):
                try:
                    if now - p.stat().st_mtime > PARTIAL_AGE_S:
                        remove(p)
                except OSError:
                    pass
            elif folder == root and (m := _OWN_ENTRY.fullmatch(p.name)):
                if m.group(1) is None or int(m.group(1)) != CACHE_FORMAT:
                    remove(p)
            elif folder != root and p.suffix == ".json" and _stale_address(p):
                remove(p)
    return gone


def _stale_address(entry: Path) -> bool:
    """Whether a cached digest's file is gone or changed (:func:`file_address`'s key)."""
    try:
        key = json.loads(entry.read_text())["key"]
        name, size, mtime, ino = key.split("\0")
        st = Path(name).stat()
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return True  # unreadable, or its file is gone
    return key != f"{name}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}"


def hash_file(path: Path) -> str:
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def _write_atomic(target: Path, text: str) -> None:
    """Written beside and renamed into place, so a reader never sees half of it; a read-only
    or full disk only costs the next process the slow read."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".partial-")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, target)
    except OSError:
        pass


def _read_header(path: Path) -> dict:
    """Parse the file with ``gguf.GGUFReader`` (slow: module docstring)."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except (ValueError, IndexError, OSError, KeyError, TypeError) as exc:  # cut short, or bad
        raise WeightsError(f"{path.name}: not a readable GGUF file (truncated or damaged: "
                           f"{exc})") from None
    meta: dict[str, Any] = {}
    big = {"tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
           "tokenizer.ggml.scores"}
    for key, field in reader.fields.items():
        if key in big or key.startswith("GGUF."):
            continue
        try:
            value = field.contents()
        except (ValueError, IndexError, UnicodeDecodeError):
            continue
        if isinstance(value, list) and len(value) > 4096:
            continue
        meta[key] = value

    def field(key: str, default: Any = ...) -> Any:
        f = reader.fields.get(key)
        if f is None:
            if default is ...:
                raise WeightsError(f"{path.name}: the file has no {key!r}: not a chat model "
                                   "this code reads")
            return default
        return f.contents()

    vocab = {
        "tokens": list(field("tokenizer.ggml.tokens")),
        "token_types": [int(t) for t in field("tokenizer.ggml.token_type")],
        "merges": list(field("tokenizer.ggml.merges", [])),
        "bos_id": int(field("tokenizer.ggml.bos_token_id", -1)),
        "eos_id": int(field("tokenizer.ggml.eos_token_id")),
        "chat_template": str(field("tokenizer.chat_template", "")),
        "pre": str(field("tokenizer.ggml.pre", "default")),
        "model": str(field("tokenizer.ggml.model", "gpt2")),
        "add_bos": bool(field("tokenizer.ggml.add_bos_token", False)),
        "eot_id": _opt_int(field("tokenizer.ggml.eot_token_id", None)),
        "eom_id": _opt_int(field("tokenizer.ggml.eom_token_id", None)),
    }
    tensors = []
    for t in reader.tensors:
        qtype = t.tensor_type.name
        if qtype not in SUPPORTED_TYPES:
            raise WeightsError(f"{path.name}: tensor {t.name} is {qtype}; supported types: "
                               f"{', '.join(SUPPORTED_TYPES)}")
        shape = [int(n) for n in reversed(t.shape.tolist())]  # GGUF lists the fastest first
        tensors.append({"name": t.name, "qtype": qtype, "shape": shape,
                        "offset": int(t.data_offset), "nbytes": int(t.n_bytes)})
    return {"meta": meta, "vocab": vocab, "tensors": tensors}


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)
