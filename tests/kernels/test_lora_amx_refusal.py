"""The fused LoRA product (kernels/lora_amx.py) states what it takes (SUPPORTS) and refuses the rest with a reason,
on any CPU; LoRALinear then computes the same product through the library calls (train/lora.py)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from tinystack.kernels import cpu, lora_amx
from tinystack.train.lora import LoRALinear


def _weight(out: int = 64, inp: int = 96, dtype=torch.bfloat16, device="cpu") -> torch.Tensor:
    return torch.zeros(out, inp, dtype=dtype, device=device)


@pytest.mark.parametrize("w, why", [
    (_weight(dtype=torch.float32), "dtype torch.float32"),
    (_weight(40, 96), "multiples of 32"),
    (_weight(64, 100), "multiples of 32"),
    (_weight(device="meta"), "on meta"),
], ids=["float32", "rows-40", "in-100", "meta-device"])
def test_what_the_fused_product_was_not_written_for_is_refused_with_the_reason(w, why):
    reason = lora_amx.refusal(w)
    assert reason is not None and why in reason
    a, b = torch.zeros(8, w.shape[1], dtype=w.dtype), torch.zeros(w.shape[0], 8, dtype=w.dtype)
    assert lora_amx.prepare(w, a, b, 2.0, [0, w.shape[0]], 8, None) is None


def test_a_cpu_without_amx_is_refused_before_anything_is_compiled(monkeypatch):
    monkeypatch.setattr(cpu, "has_amx", lambda: False)
    monkeypatch.setattr(lora_amx, "ops", lambda: pytest.fail("compiled on a CPU without AMX"))
    assert lora_amx.refusal(_weight()) == "this CPU has no AMX BF16"


@torch.no_grad()
def test_a_refused_layer_computes_the_lora_product_through_the_library_calls(monkeypatch):
    monkeypatch.setattr(lora_amx, "refusal", lambda w: "refused by this test")
    torch.manual_seed(0)
    base = nn.Linear(96, 64, dtype=torch.bfloat16)
    layer = LoRALinear(base, rank=8, alpha=16.0)
    layer.lora_B.normal_()
    x = torch.randn(32, 96, dtype=torch.bfloat16)
    got = layer(x)
    assert layer._weight_copy.packed is None  # the library path took it
    xd, a, b = x.double(), layer.lora_A.double(), layer.lora_B.double()
    want = xd @ base.weight.double().t() + base.bias.double() + (xd @ a.t() @ b.t()) * layer.scale
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)
