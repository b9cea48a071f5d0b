"""The decoder architectures this code runs, by ``general.architecture``. Adding one is a module
(``models/arch_<name>.py``) declaring its :class:`~models.decoder.Architecture` and one entry below."""

from __future__ import annotations

from models import arch_llama, arch_qwen2
from models.decoder import Architecture, LlamaConfig
from models.gguf_file import WeightsError

ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (
    arch_llama.ARCH,
    arch_qwen2.ARCH,
)}

__all__ = ["ARCHITECTURES", "Architecture", "LlamaConfig", "architecture"]


def architecture(name: str) -> Architecture:
    """The registered architecture, or WeightsError naming the supported ones."""
    arch = ARCHITECTURES.get(name)
    if arch is None:
        raise WeightsError(f"the model's architecture is {name!r}; supported: "
                           f"{', '.join(sorted(ARCHITECTURES))}")
    return arch
