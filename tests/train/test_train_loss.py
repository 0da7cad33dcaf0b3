"""The training loss: train.cross_entropy against torch's F.cross_entropy on the upcast logits (value and
gradient, ignored rows, float32, bf16, float64 gradcheck), by the C++ rows (kernels/cross_entropy_rows.cpp) and
by blocks of rows (across block boundaries); the one ignore index (-100) in every loss path (lm_loss,
eval.scoring.token_nll); the head run only at positions with a target (loss.target_logits, the models' bool
logit_index) gives the same loss and gradients."""
import pytest
import torch
import torch.nn.functional as F

from tinystack.eval.scoring import token_nll
from tinystack.kernels import fused_ops
from tinystack.model import GPT, GPTConfig, Llama, LlamaConfig
from tinystack.train import cross_entropy as ce
from tinystack.train.loss import IGNORE_INDEX, lm_loss, target_logits

PATHS = ["native", "blocks"] if fused_ops.extension() is not None else ["blocks"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_torch_value_and_gradient(dtype, path, monkeypatch):
    monkeypatch.setattr(ce, "BLOCK_BYTES", 4 * 97 * 3)  # 3 rows per block: 11 rows cross several boundaries
    if path == "blocks":
        monkeypatch.setattr(ce, "_native", lambda logits: False)
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(11, 97, generator=g) * 4).to(dtype).requires_grad_(True)
    targets = torch.randint(0, 97, (11,), generator=g)
    targets[[1, 5, 10]] = IGNORE_INDEX  # prompt/padding positions carry no loss and get no gradient
    before = logits.detach().clone()
    ours = ce.cross_entropy(logits, targets, IGNORE_INDEX)
    (ours * 3.0).backward()
    got = logits.grad
    logits.grad = None
    ref = F.cross_entropy(logits.float(), targets, ignore_index=-100)
    (ref * 3.0).backward()
    assert ours.dtype == torch.float32 and got.dtype == dtype
    assert torch.allclose(ours, ref, rtol=1e-6, atol=1e-6)
    assert torch.allclose(got.float(), logits.grad.float(), rtol=0, atol=1e-6 if dtype == torch.float32 else 4e-3)
    assert not got[[1, 5, 10]].any()
    assert torch.equal(logits.detach(), before)  # the blocks are copies: the logits themselves are never written


@pytest.mark.skipif(fused_ops.extension() is None, reason="needs the C++ extension (a C++ compiler)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_rows_at_a_real_vocabulary_and_extreme_logits(dtype):
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(7, 49_152, generator=g) * 6).to(dtype)
    logits[0, :100] = 80.0  # exp would overflow without the max subtracted
    logits[1] = -1e4  # a flat, very negative row
    logits[2, 5] = float("-inf")  # a word the model rules out
    logits.requires_grad_(True)
    targets = torch.tensor([3, 17, 4, IGNORE_INDEX, 49_151, 0, 12])
    ours = ce.cross_entropy(logits, targets, IGNORE_INDEX)
    ours.backward()
    got = logits.grad
    logits.grad = None
    ref = F.cross_entropy(logits.float(), targets, ignore_index=-100)
    ref.backward()
    assert torch.allclose(ours, ref, rtol=1e-5, atol=1e-5)
    assert torch.allclose(got.float(), logits.grad.float(), rtol=0, atol=1e-6 if dtype == torch.float32 else 1e-4)
    assert torch.isfinite(got).all() and not got[3].any() and got[2, 5] == 0


def test_gradcheck_float64_and_all_ignored_is_nan():
    logits = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([3, IGNORE_INDEX, 0, 6, 2])
    assert torch.autograd.gradcheck(lambda x: ce.cross_entropy(x, targets, IGNORE_INDEX), (logits,))
    assert torch.isnan(ce.cross_entropy(logits, torch.full((5,), IGNORE_INDEX), IGNORE_INDEX))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_one_ignore_index_in_every_loss_path(dtype, monkeypatch):
    """token_nll (what every score sums) and lm_loss (training's mean) against F.cross_entropy with
    ignore_index=-100 on random logits with ignored positions, across token_nll's row blocks."""
    from tinystack.nn import nll as scoring  # token_nll's module (eval.scoring re-exports it)

    assert IGNORE_INDEX == -100
    monkeypatch.setattr(scoring, "BLOCK_BYTES", 4 * 53 * 4)  # 4 rows per block: 3 x 9 rows cross boundaries
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(3, 9, 53, generator=g, dtype=torch.float64) * 3).to(dtype)
    targets = torch.randint(0, 53, (3, 9), generator=g)
    ignored = torch.rand(3, 9, generator=g) < 0.3
    targets[ignored] = IGNORE_INDEX
    up = logits.to(torch.promote_types(dtype, torch.float32))
    ref = F.cross_entropy(up.transpose(1, 2), targets, ignore_index=-100, reduction="none")
    nll = token_nll(logits, targets)
    assert nll.shape == targets.shape and nll.dtype == up.dtype
    assert torch.equal(nll[ignored], torch.zeros_like(nll[ignored])) and (nll[~ignored] > 0).all()
    assert torch.allclose(nll, ref, rtol=1e-6, atol=1e-6)
    mean = F.cross_entropy(up.reshape(-1, 53), targets.reshape(-1), ignore_index=-100)
    assert torch.allclose(nll.sum() / (~ignored).sum(), mean, rtol=1e-6)
    assert torch.allclose(lm_loss(logits, targets).to(mean.dtype), mean, rtol=1e-6)
    with pytest.raises(IndexError):  # -1 is no longer a "no target" value: an out-of-range class
        token_nll(logits.float(), torch.full((3, 9), -1))


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_head_only_at_target_positions_gives_the_same_loss_and_gradients(kind):
    torch.manual_seed(0)
    if kind == "gpt2":
        model = GPT(GPTConfig(vocab_size=41, block_size=16, n_layer=2, n_head=2, n_embd=16))
    else:
        model = Llama(LlamaConfig(vocab_size=41, hidden_size=16, intermediate_size=24, n_layer=2, n_head=2,
                                  n_kv_head=1, max_position_embeddings=16, tie_word_embeddings=True))
    x = torch.randint(0, 41, (3, 16))
    y = torch.randint(0, 41, (3, 16))
    y[0, :9] = y[1, :4] = y[2, 12:] = IGNORE_INDEX  # prompt tokens and padding: no target
    grads = []
    for select in (True, False):
        model.zero_grad()
        if select:
            logits, kept = target_logits(model, x, y)
            assert logits.shape[0] == int((y != IGNORE_INDEX).sum()) and torch.equal(kept, y[y != IGNORE_INDEX])
        else:
            logits, kept = model(x)[0], y
        loss = lm_loss(logits, kept)
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (l1, g1), (l2, g2) = grads
    assert torch.allclose(l1, l2, atol=1e-6) and all(torch.allclose(a, b, atol=1e-6) for a, b in zip(g1, g2))
    full = torch.ones_like(y)  # every position a target: the plain path, logits [B, T, V]
    assert target_logits(model, x, full)[0].shape == (3, 16, 41)


def test_the_models_own_forward_loss_skips_the_same_ignore_index():
    """GPT/Llama forward(x, targets) (model.gpt.head_and_loss: the bare loops, the eval test fixtures) skips
    IGNORE_INDEX targets like lm_loss does, so no second convention is left in the tree."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=41, block_size=16, n_layer=1, n_head=2, n_embd=16))
    x, y = torch.randint(0, 41, (2, 16)), torch.randint(0, 41, (2, 16))
    y[0, :5] = y[1, 10:] = IGNORE_INDEX
    logits, loss = model(x, y)
    assert torch.allclose(loss, lm_loss(logits, y), rtol=1e-6)
    assert torch.allclose(loss, token_nll(logits, y).sum() / (y != IGNORE_INDEX).sum(), rtol=1e-6)


def test_held_out_score_equals_the_old_training_path_loss():
    """Fine-tuning's held-out loss moved from the training path (next_token_loss under no_grad: the frozen-head
    rows) to eval.scoring.score_batches; on padded batches with prompt targets the token-weighted numbers agree."""
    from tinystack.eval.scoring import score_batches
    from tinystack.train.loss import next_token_loss

    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=41, hidden_size=16, intermediate_size=24, n_layer=2, n_head=2,
                              n_kv_head=1, max_position_embeddings=16, tie_word_embeddings=True)).eval()
    batches = []
    for _ in range(2):
        x, y = torch.randint(0, 41, (3, 16)), torch.randint(0, 41, (3, 16))
        y[0, :9] = y[1, :4] = y[2, 12:] = IGNORE_INDEX
        batches.append((x, y))
    with torch.no_grad():
        old = [(next_token_loss(model, x, y).item(), int((y != IGNORE_INDEX).sum())) for x, y in batches]
    s = score_batches(model, batches)
    assert s.tokens == sum(n for _, n in old)
    assert s.loss == pytest.approx(sum(v * n for v, n in old) / s.tokens, rel=1e-6)
