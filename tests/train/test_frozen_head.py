"""The loss through a frozen head without its logits (train.frozen_head), held against the head's logits followed by
train.cross_entropy (itself held against F.cross_entropy in test_train_loss.py): value and gradient in float32,
bf16 autocast and float64, across block boundaries, by the C++ rows and by PyTorch ops, ignored rows; the cast
weight it keeps follows the weight; and loss.next_token_loss takes this path exactly when the head is frozen,
with the same loss and gradients as the logits path on GPT-2 and Llama, LoRA included."""
import pytest
import torch
import torch.nn.functional as F

from tinystack.kernels import fused_ops
from tinystack.model import GPT, GPTConfig, Llama, LlamaConfig
from tinystack.train import frozen_head as fh
from tinystack.train.cross_entropy import cross_entropy
from tinystack.train.lora import inject_lora
from tinystack.train.loss import IGNORE_INDEX, lm_loss, next_token_loss, target_logits

PATHS = ["native", "torch"] if fused_ops.extension() is not None else ["torch"]


def _reference(h, w, targets, autocast):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        return cross_entropy(F.linear(h, w), targets, IGNORE_INDEX)


# float64 always runs the PyTorch ops (the C++ rows take bf16 and float32)
CASES = [(case, path) for case in ("float32", "bf16-autocast") for path in PATHS] + [("float64", "torch")]


@pytest.mark.parametrize(("case", "path"), CASES)
def test_value_and_gradient_match_the_logits_path(case, path, monkeypatch):
    dtype = torch.float64 if case == "float64" else torch.float32
    autocast = case == "bf16-autocast"
    monkeypatch.setattr(fh, "BLOCK_BYTES", 4 * 97 * 2 * 3)  # 6 rows a block in float32: 23 rows, 4 blocks
    if path == "torch":
        monkeypatch.setattr(fh, "_native", lambda h: False)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(23, 16, generator=g, dtype=dtype).requires_grad_(True)
    w = torch.randn(97, 16, generator=g, dtype=dtype)
    targets = torch.randint(0, 97, (23,), generator=g)
    targets[[0, 6, 7, 22]] = IGNORE_INDEX  # no target there: no loss, no gradient
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        ours = fh.frozen_head_loss(h, w, targets, IGNORE_INDEX)
    (ours * 2.5).backward()
    got, h.grad = h.grad, None
    ref = _reference(h, w, targets, autocast)
    (ref * 2.5).backward()
    assert ours.dtype == ref.dtype and got.dtype == h.dtype
    tol = {"float32": 1e-6, "float64": 1e-8, "bf16-autocast": 1e-6}[case]
    assert torch.allclose(ours, ref, rtol=tol, atol=tol)
    # bf16: each product rounds its output, blocks or not, so ours and the reference may differ by a unit in the
    # last place (1 / 128 relative): 1 % of the largest gradient
    atol = tol if not autocast else 1e-2 * float(h.grad.abs().max())
    assert torch.allclose(got, h.grad, rtol=tol if not autocast else 1e-2, atol=atol)
    assert not got[[0, 6, 7, 22]].any()


def test_every_row_ignored_is_nan_and_no_grad_mode_needs_no_gradient():
    h, w = torch.randn(4, 8, requires_grad=True), torch.randn(11, 8)
    assert torch.isnan(fh.frozen_head_loss(h, w, torch.full((4,), IGNORE_INDEX), IGNORE_INDEX))
    with torch.no_grad():
        t = torch.tensor([1, 2, 3, 4])
        assert torch.allclose(fh.frozen_head_loss(h, w, t, IGNORE_INDEX), cross_entropy(h @ w.t(), t, IGNORE_INDEX))


def test_a_head_that_trains_is_refused():
    w = torch.randn(11, 8, requires_grad=True)
    with pytest.raises(ValueError, match="requires a gradient"):
        fh.frozen_head_loss(torch.randn(4, 8), w, torch.tensor([1, 2, 3, 4]), IGNORE_INDEX)


def test_the_kept_bf16_weight_follows_changes_to_the_weight():
    torch.manual_seed(0)
    h, t = torch.randn(5, 8), torch.tensor([0, 3, 5, 7, 9])
    w = torch.nn.Parameter(torch.randn(11, 8), requires_grad=False)

    def loss():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return fh.frozen_head_loss(h, w, t, IGNORE_INDEX)
    first = loss()
    assert torch.equal(loss(), first)  # kept: the same copy, the same value
    with torch.no_grad():
        w.mul_(3.0)  # an in-place change moves the version counter: the copy is made anew
    assert torch.allclose(loss(), _reference(h, w, t, True))
    assert not torch.allclose(loss(), first)
    w.data = torch.randn(11, 8)  # a new tensor behind the parameter (load_state_dict, .to()): also noticed
    assert torch.allclose(loss(), _reference(h, w, t, True))


@pytest.mark.skipif(fused_ops.extension() is None, reason="needs the C++ extension (a C++ compiler)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inplace_gradient_rows_equal_the_copying_ones(dtype):
    g = torch.Generator().manual_seed(2)
    logits = (torch.randn(6, 301, generator=g) * 5).to(dtype)
    targets = torch.tensor([0, 300, 5, 17, 17, 2])
    lse = torch.logsumexp(logits.float(), dim=1)
    scale = torch.tensor([0.5, 0.0, 1.0, 0.25, 0.25, 2.0])  # a 0 marks an ignored row
    ext = fused_ops.extension()
    copied = ext.cross_entropy_grad(logits, targets, lse, scale, False)
    inplace = logits.clone()
    assert ext.cross_entropy_grad(inplace, targets, lse, scale, True).data_ptr() == inplace.data_ptr()
    assert torch.equal(inplace, copied) and not copied[1].any()


def _model(kind: str, lora: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "gpt2":
        model = GPT(GPTConfig(vocab_size=41, block_size=16, n_layer=2, n_head=2, n_embd=16))
        targets = ("c_attn", "c_proj", "c_fc")
    else:
        model = Llama(LlamaConfig(vocab_size=41, hidden_size=16, intermediate_size=24, n_layer=2, n_head=2,
                                  n_kv_head=1, max_position_embeddings=16, tie_word_embeddings=True))
        targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    if lora:
        inject_lora(model, rank=2, alpha=4.0, targets=targets)
        for name, p in model.named_parameters():
            if "lora_b" in name:
                torch.nn.init.normal_(p, std=0.1)  # B starts at zero: give the adapters a gradient through A too
    else:
        model.get_submodule("lm_head").weight.requires_grad_(False)  # a frozen (tied) head, the rest trains
    return model


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16-autocast"])
@pytest.mark.parametrize("lora", [True, False], ids=["lora", "frozen-head"])
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_next_token_loss_without_logits_matches_the_logits_path(kind, lora, autocast):
    model = _model(kind, lora)
    x = torch.randint(0, 41, (3, 16))
    y = torch.randint(0, 41, (3, 16))
    y[0, :9] = y[1, :4] = y[2, 12:] = IGNORE_INDEX  # a chat's prompt and padding
    results = []
    for ours in (True, False):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = next_token_loss(model, x, y) if ours else lm_loss(*target_logits(model, x, y))
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}))
    (l1, g1), (l2, g2) = results
    tol = 1e-5 if not autocast else 1e-2
    assert torch.allclose(l1, l2, atol=tol) and g1.keys() == g2.keys() and g1
    assert all(torch.allclose(g1[n], g2[n], atol=tol, rtol=tol) for n in g1)


def test_next_token_loss_takes_the_logits_when_the_head_trains(monkeypatch):
    model = _model("llama", lora=False)
    model.get_submodule("lm_head").weight.requires_grad_(True)
    monkeypatch.setattr("tinystack.train.loss.frozen_head_loss", None)  # this path must not be taken
    x, y = torch.randint(0, 41, (2, 16)), torch.randint(0, 41, (2, 16))
    next_token_loss(model, x, y).backward()
    assert model.get_submodule("lm_head").weight.grad is not None


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_apply_head_false_returns_the_heads_input(kind):
    model = _model(kind, lora=False).eval()
    x = torch.randint(0, 41, (2, 16))
    h = model(x, apply_head=False)[0]
    assert h.shape == (2, 16, 16)
    assert torch.allclose(model.get_submodule("lm_head")(h), model(x)[0], atol=1e-6)


def test_the_frozen_path_keeps_nothing_vocabulary_sized_for_the_backward():
    """What makes it cheaper: the logits path saves [N, V] logits for its backward, the frozen path only
    d loss / d h [N, C]; checked through autograd's saved-tensor hooks."""
    model = _model("llama", lora=True)
    x, y = torch.randint(0, 41, (2, 16)), torch.randint(0, 41, (2, 16))
    for frozen in (True, False):
        saved: list[torch.Size] = []

        def pack(t, saved=saved):
            saved.append(t.shape)
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = next_token_loss(model, x, y) if frozen else lm_loss(*target_logits(model, x, y))
        vocab_sized = [s for s in saved if len(s) >= 2 and s[-1] == 41 and s.numel() >= 32 * 41]
        assert bool(vocab_sized) != frozen, (frozen, vocab_sized)
        loss.backward()
