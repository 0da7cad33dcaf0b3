"""The packed formats are GGUF's: tensors of the SmolLM2 GGUF (Q4_1 layers, Q8_0 embedding) load without
re-quantising, dequantise as the importer does, re-quantise to the same bytes, and multiply on every path."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tinystack.infer.quant import kernels
from tinystack.infer.quant.formats import dequantize, from_gguf, quantize, to_gguf
from tinystack.kernels import quant as quant_kernels

NAMES = ("token_embd.weight", "blk.0.attn_q.weight", "blk.3.ffn_down.weight", "blk.29.attn_k.weight")


@pytest.fixture(scope="module")
def gguf_tensors():
    gguf = pytest.importorskip("gguf")
    from tinystack.model.importer import resolve_source

    path, _ = resolve_source("smollm2-135m-instruct")
    reader = gguf.GGUFReader(path)
    return {t.name: (t.tensor_type.name.lower(), int(t.tensor_type), int(t.shape[0]),
                     torch.from_numpy(np.array(t.data).view(np.uint8).reshape(int(t.shape[1]), -1)))
            for t in reader.tensors if t.name in NAMES}


def test_gguf_tensors_pack_without_requantising(gguf_tensors):
    from tinystack.model.gguf_dequant import dequantize as importer_dequantize

    assert set(gguf_tensors) == set(NAMES)
    for name, (fmt, ggml_type, k, raw) in gguf_tensors.items():
        assert fmt in ("q8_0", "q4_1")
        p = from_gguf(raw, fmt, k)
        assert torch.equal(to_gguf(p), raw)
        w = dequantize(p)
        assert np.array_equal(w.numpy(), importer_dequantize(raw.numpy(), ggml_type, (raw.shape[0], k))), name
        # a dequantised GGUF tensor quantises back to its own bytes: our packer rounds as llama.cpp's
        assert torch.equal(to_gguf(quantize(w, fmt)), raw), name


@pytest.mark.parametrize("path", quant_kernels.available_paths())
def test_gguf_packed_weights_multiply_on_every_path(gguf_tensors, path):
    fmt, _, k, raw = gguf_tensors["blk.3.ffn_down.weight"]
    p = from_gguf(raw, fmt, k)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(0))
    want = x @ dequantize(p).T
    got = kernels.matmul(x, p, path=path)
    assert ((got - want).abs() <= 0.02 * (x.abs() @ dequantize(p).abs().T)).all()
