"""Span bundles a worker makes from the model files it holds, instead of receiving them.

A worker started with ``--model PATH`` holds that GGUF file and announces its content address
(swarm.members). A span call (``llama_span.forward``) names its weights by the content address
of a bundle (models.span.bundle) the requester made from its own copy of the file; a worker
that lacks that object would ask for it, and the requester would send a few hundred MB. A
worker holding the file the call's ``model`` names makes the same bundle from its own disk
instead, and uses it only if its content address is the one the call named: the bytes are then
exactly the requester's, whoever made them. Otherwise (another copy of the file, a requester
naming a model it does not run) the worker asks for the object as before: nothing is lost.

Whose word: the requester's ``model``, ``first`` and ``count`` only choose which bytes to try;
the content address decides. What it costs the worker: reading and hashing one span of a file
it chose to hold; a span that did not match is not made again (the last :data:`FAILED` are
kept), so a requester naming spans that never match cannot make it redo the work, and the
spans of one file are at most ``blocks * (blocks + 1) / 2``.
"""

from __future__ import annotations

import logging
import mmap
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from swarm.runtime.objects import ObjectId, object_id
from swarm.runtime.protocol import RunTask

log = logging.getLogger(__name__)

FAILED = 256
"""(model, first, count) spans that did not match, kept: they are not made again."""


@dataclass(frozen=True)
class Build:
    """A bundle to make from a held file: blocks ``[first, first + count)`` of ``path``."""

    model: bytes
    path: Path
    first: int
    count: int
    oid: ObjectId
    """The content address the call named: the bundle is used only if it is this."""


class LocalBundles:
    """The model files a worker holds (model id, the first bytes of the file's content
    address as span calls name it, to path) and which spans it made or failed to make."""

    def __init__(self, files: Mapping[bytes, Path | str]) -> None:
        self.files = {k: Path(v) for k, v in files.items()}
        self._failed: OrderedDict[tuple[bytes, int, int], None] = OrderedDict()
        self.made = 0
        """Bundles made here and used (tests and status read it)."""

    def wanted(self, msg: RunTask, held: Any) -> Build | None:
        """The bundle ``msg`` needs that this worker can make, or None (the call is not a span
        call, its bundle is held already, its model is not a file held here, or this span did
        not match before). ``held``: the object store (``get(oid)``)."""
        if msg.actor != "llama_span" or msg.method != "forward" or len(msg.args) != 2:
            return None
        oid = msg.args[1].oid
        if oid is None or len(oid) != 32 or held.get(ObjectId(oid)) is not None:
            return None
        try:
            params = msgpack.unpackb(msg.params, raw=False) if msg.params else {}
        except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
            return None  # the call itself is refused as malformed
        if not isinstance(params, dict):
            return None
        model, first, count = params.get("model"), params.get("first"), params.get("count")
        if not isinstance(model, bytes) or model not in self.files \
                or type(first) is not int or type(count) is not int or first < 0 or count < 1:
            return None
        if (model, first, count) in self._failed:
            return None
        return Build(model, self.files[model], first, count, ObjectId(oid))

    def make(self, build: Build) -> np.ndarray | None:
        """The bundle of ``build`` from the file, if its content address is the one the call
        named (else None, logged, and not tried again). Blocking: reads and hashes the span."""
        flat = self._make(build)
        if flat is None:
            self._failed[(build.model, build.first, build.count)] = None
            while len(self._failed) > FAILED:
                self._failed.popitem(last=False)
            return None
        self.made += 1
        return flat

    def _make(self, build: Build) -> np.ndarray | None:
        from models import gguf_weights
        from models import span as llama_span
        from models.gguf_file import WeightsError, open_file

        try:
            # mapped afresh and let go page by page as copied: the file's pages would
            # otherwise stay in this worker's RSS beside the bundle, twice its span
            weights = gguf_weights.read(open_file(build.path))
            if build.first + build.count > weights.config.n_layers:
                return None
            layers = llama_span.model_layers(weights, build.first, build.count)
            flat = llama_span.bundle_of(weights.config, layers, copied=_let_go)
        except (WeightsError, OSError, ValueError, KeyError) as exc:
            log.warning("blocks %d..%d of %s: cannot make them here (%s); the requester "
                        "sends them", build.first, build.first + build.count - 1,
                        build.path.name, exc)
            return None
        if object_id(flat) != build.oid:
            log.warning("blocks %d..%d of %s as this worker's copy holds them differ from the "
                        "requester's (content address mismatch); the requester sends its own",
                        build.first, build.first + build.count - 1, build.path.name)
            return None
        return flat


def _let_go(src: np.ndarray) -> None:
    """Drop the pages of the file mapping ``src`` views from this process (the page cache
    keeps them; nothing is written: the mapping is read-only)."""
    base: Any = src
    while base is not None:
        mm = getattr(base, "_mmap", None)
        if isinstance(mm, mmap.mmap):
            mm.madvise(mmap.MADV_DONTNEED)
            return
        base = getattr(base, "base", None)
