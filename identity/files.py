"""One writer for private files (keys, secrets, state): whole, 0600, atomic.

Every file a peer keeps about itself is written here: under a temporary name of this
process, flushed to disk, then put in place, so that a reader (or a crash) sees the old file
or the new one, never part of one, and never a looser mode than 0600 (umask or not).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def write_private(path: Path, data: bytes, *, exclusive: bool = False) -> bool:
    """Write ``data`` as the whole of ``path`` (mode 0600; missing folders made 0700).

    It replaces what stands there, or with ``exclusive`` is put in place only where nothing
    stands yet: False then, and the file that stands is kept (another process made it first).
    A failure leaves no temporary file behind, so no stray copy of a secret."""
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.new")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if not exclusive:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
