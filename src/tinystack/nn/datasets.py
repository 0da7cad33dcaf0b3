"""Classification data for the NumPy MLP: scikit-learn's bundled digits, and MNIST IDX files.

    load_digits()      8x8 digits shipped inside scikit-learn (no download): x [N, 64] in [0, 1], y [N]
    read_idx(path)     any IDX file (MNIST's format; .gz too) -> ndarray of its declared dtype and shape
    load_mnist(dir)    the four standard MNIST files -> (x_train [60000, 784] in [0, 1], y_train, x_test, y_test)

All return float32 features; splits are seeded so accuracy figures are reproducible.
"""
from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

from tinystack.errors import require

# IDX magic: two zero bytes, a dtype code, the number of dims; then one big-endian uint32 per dim.
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
MNIST_FILES = {
    "x_train": "train-images-idx3-ubyte", "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte", "y_test": "t10k-labels-idx1-ubyte",
}


def read_idx(path: str | Path) -> np.ndarray:
    """Parse an IDX file (optionally gzip-compressed, by the .gz suffix); ValueError if malformed."""
    path = Path(path)
    raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path}: not an IDX file (bad magic {raw[:4].hex()})")
    ndim = raw[3]
    shape = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    data = np.frombuffer(raw, dtype=dtype, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{path}: header says shape {shape}, file holds {data.size} values")
    return data.reshape(shape).astype(dtype.newbyteorder("="))


def _find(directory: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx")):
        if (directory / name).is_file():
            return directory / name
    raise FileNotFoundError(f"{directory}: no {stem}[.gz] (MNIST IDX files expected)")


def load_mnist(directory: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """MNIST from a folder holding the four IDX files: images flattened to [N, 784] float32 in [0, 1]."""
    d = Path(directory)
    arrays = {k: read_idx(_find(d, stem)) for k, stem in MNIST_FILES.items()}
    flat = lambda a: (a.reshape(len(a), -1) / 255.0).astype(np.float32)  # noqa: E731
    return (flat(arrays["x_train"]), arrays["y_train"].astype(np.int64),
            flat(arrays["x_test"]), arrays["y_test"].astype(np.int64))


def load_digits(test_fraction: float = 0.2, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 8x8 digits, pixels scaled to [0, 1], a seeded stratified-free random split."""
    ds = require("sklearn.datasets", "dev", "the digits data (it ships with scikit-learn)").load_digits()
    x, y = (ds.data / 16.0).astype(np.float32), ds.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(round(len(x) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]
