"""The NumPy MLP reaches >= 97% on scikit-learn's digits; MNIST IDX files are read exactly."""
from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from tinystack.nn import MLP
from tinystack.nn.classify import accuracy, fit
from tinystack.nn.datasets import load_digits, load_mnist, read_idx


def test_mlp_reaches_97_percent_on_digits() -> None:
    x_tr, y_tr, x_te, y_te = load_digits(test_fraction=0.2, seed=0)
    assert x_tr.shape[1] == 64 and len(x_te) == 359
    model = MLP([64, 128, 10], seed=0)
    result = fit(model, x_tr, y_tr, epochs=30, batch_size=32, lr=3e-3, seed=0)
    assert result.losses[-1] < result.losses[0]
    assert accuracy(model, x_te, y_te) >= 0.97


def _idx_bytes(a: np.ndarray, code: int, be: str) -> bytes:
    return bytes([0, 0, code, a.ndim]) + struct.pack(f">{a.ndim}I", *a.shape) + a.astype(be).tobytes()


def test_read_idx_plain_and_gzip(tmp_path) -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (5, 28, 28)).astype(np.uint8)
    (tmp_path / "imgs").write_bytes(_idx_bytes(images, 0x08, ">u1"))
    floats = rng.normal(size=(3, 4))
    with gzip.open(tmp_path / "f.gz", "wb") as f:
        f.write(_idx_bytes(floats, 0x0E, ">f8"))  # big-endian doubles: byte order must be honoured
    assert np.array_equal(read_idx(tmp_path / "imgs"), images)
    assert np.array_equal(read_idx(tmp_path / "f.gz"), floats)
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(ValueError, match="not an IDX"):
        read_idx(tmp_path / "bad")
    (tmp_path / "short").write_bytes(_idx_bytes(images, 0x08, ">u1")[:-10])
    with pytest.raises(ValueError, match="header says"):
        read_idx(tmp_path / "short")


def test_load_mnist_from_a_folder(tmp_path) -> None:
    rng = np.random.default_rng(1)
    for stem, n in (("train", 6), ("t10k", 4)):
        imgs = rng.integers(0, 256, (n, 28, 28)).astype(np.uint8)
        labels = rng.integers(0, 10, n).astype(np.uint8)
        with gzip.open(tmp_path / f"{stem}-images-idx3-ubyte.gz", "wb") as f:
            f.write(_idx_bytes(imgs, 0x08, ">u1"))
        (tmp_path / f"{stem}-labels-idx1-ubyte").write_bytes(_idx_bytes(labels, 0x08, ">u1"))
    x_tr, y_tr, x_te, y_te = load_mnist(tmp_path)
    assert x_tr.shape == (6, 784) and x_te.shape == (4, 784) and x_tr.dtype == np.float32
    assert 0.0 <= x_tr.min() and x_tr.max() <= 1.0 and y_tr.dtype == np.int64
    with pytest.raises(FileNotFoundError):
        load_mnist(tmp_path / "nowhere")
