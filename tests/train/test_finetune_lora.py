"""LoRA (train/lora.py): a fresh adapter changes nothing, merging gives the adapted model's logits, the base
stays frozen, only adapters reach the optimiser, and the merged model saves as an ordinary model directory."""
import pytest
import torch
from train_helpers import cfg, lora_bf16_paths

from tinystack.model import GPT, GPTConfig, Llama, LlamaConfig, load_model, save_model
from tinystack.train import lora as lora_module
from tinystack.train.lora import LoRALinear, inject_lora, lora_parameters, merge_lora
from tinystack.train.optimizer import make_optimizer

VOCAB = 53


def _model(kind):
    torch.manual_seed(0)
    if kind == "gpt2":
        return GPT(GPTConfig(vocab_size=VOCAB, block_size=24, n_layer=2, n_head=2, n_embd=16)).eval()
    return Llama(LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=40, n_layer=2, n_head=4, n_kv_head=2,
                             max_position_embeddings=24, tie_word_embeddings=kind == "llama-tied")).eval()


def _tokens(seed=1):
    return torch.randint(0, VOCAB, (3, 24), generator=torch.Generator().manual_seed(seed))


def _randomise_b(model, seed=2):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=g) * 0.5)


KINDS = ["gpt2", "llama", "llama-tied"]


@pytest.mark.parametrize("kind", KINDS)
def test_fresh_adapters_change_nothing(kind):
    model, x = _model(kind), _tokens()
    before = model(x)[0]
    names = inject_lora(model, rank=4, alpha=8)
    assert names and all(isinstance(model.get_submodule(n), LoRALinear) for n in names)
    assert torch.equal(model(x)[0], before)  # B = 0: the update is exactly zero


@pytest.mark.parametrize("kind", KINDS)
def test_merged_model_gives_the_adapted_logits(kind, tmp_path):
    model, x = _model(kind), _tokens()
    base = model(x)[0]
    inject_lora(model, rank=4, alpha=8)
    _randomise_b(model)
    with torch.no_grad():
        adapted = model(x)[0]
        assert (adapted - base).abs().max() > 1e-2  # the adapters do something, so the comparison means something
        merged = merge_lora(model)(x)[0]
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    assert torch.allclose(merged, adapted, atol=1e-5, rtol=0)
    save_model(model, tmp_path, eos_token_id=0)  # an ordinary directory: the plain loader reads it
    with torch.no_grad():
        assert torch.allclose(load_model(tmp_path)(x)[0], adapted, atol=1e-5, rtol=0)


def test_targets_select_layers_and_the_rest_is_frozen():
    model = _model("llama")
    names = inject_lora(model, rank=2, alpha=2, targets=["q_proj", "v_proj"])
    assert sorted(names) == sorted(f"model.layers.{i}.self_attn.{p}" for i in range(2) for p in ("q_proj", "v_proj"))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"{n}.lora_{ab}" for n in names for ab in "AB"}
    gpt = _model("gpt2")
    assert len(inject_lora(gpt, rank=2, alpha=2)) == 2 * 4  # c_attn, attn.c_proj, c_fc, mlp.c_proj per block
    with pytest.raises(ValueError, match="no linear layer matches LoRA targets") as e:
        inject_lora(_model("llama"), rank=2, alpha=2, targets=["c_attn"])
    assert "'q_proj'" in str(e.value) and "'gate_proj'" in str(e.value)  # names a target can use
    fused = _model("llama")
    fused.fuse_projections()  # q/k/v and gate/up fused, as the trainer runs them: still targeted by those names
    with pytest.raises(ValueError) as e:
        inject_lora(fused, rank=2, alpha=2, targets=["nonsense"])
    assert "'k_proj'" in str(e.value) and "'up_proj'" in str(e.value) and "qkv_proj" not in str(e.value)
    comma = _model("llama")  # "q_proj,v_proj" as typed after --lora-targets: two targets
    assert sorted(inject_lora(comma, rank=2, alpha=2, targets=["q_proj,v_proj"])) == sorted(names)
    with pytest.raises(ValueError, match="rank must be positive"):
        inject_lora(_model("llama"), rank=0, alpha=2)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_training_moves_adapters_only(kind):
    model, x = _model(kind), _tokens()
    inject_lora(model, rank=4, alpha=8)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    opt = make_optimizer(model, cfg(learning_rate=1e-2, weight_decay=0.1))
    in_opt = [p for g in opt.param_groups for p in g["params"]]
    assert {id(p) for p in in_opt} == {id(p) for p in lora_parameters(model)}
    model.train()
    for _ in range(3):
        logits, _ = model(x[:, :-1])
        torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1)).backward()
        opt.step()
        opt.zero_grad()
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if not p.requires_grad)
    assert all(p.grad is None for p in model.parameters() if not p.requires_grad)
    assert all((m.lora_B != 0).any() for m in model.modules() if isinstance(m, LoRALinear))
    state = sum(t.numel() for s in opt.state.values() for t in s.values() if t.dim() > 0)
    assert state == 2 * sum(p.numel() for p in lora_parameters(model))  # exp_avg + exp_avg_sq, adapters only


def test_adapter_init_and_scale():
    lin = torch.nn.Linear(12, 7)
    torch.manual_seed(0)
    lora = LoRALinear(lin, rank=3, alpha=6)
    assert lora.scale == 2.0 and lora.lora_A.shape == (3, 12) and lora.lora_B.shape == (7, 3)
    assert torch.count_nonzero(lora.lora_B) == 0 and lora.lora_A.std() > 0
    bound = 1 / 12 ** 0.5  # kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(fan_in), 1/sqrt(fan_in)), nn.Linear's own
    assert lora.lora_A.abs().max() <= bound
    with torch.no_grad():
        lora.lora_B.fill_(0.1)
    x = torch.randn(5, 12)
    expected = lin(x) + 2.0 * (x @ lora.lora_A.t() @ lora.lora_B.t())
    assert torch.allclose(lora(x), expected, atol=1e-6)


@pytest.mark.parametrize("bias, parts", [(False, None), (True, None), (True, ([5, 3, 4], [True, False, True]))])
@pytest.mark.parametrize("need_x", [True, False])
@pytest.mark.parametrize("product", ["C++", "C++ rows split", "PyTorch"])
def test_hand_written_backward_equals_autograd(bias, parts, need_x, product, monkeypatch):
    """The hand-written product against autograd's graph of the same layer (gradcheck also changes B between a
    forward and its backward: the backward must use the forward's B), for one adapter and for a fused layer
    with two of its three parts adapted, with and without the input's gradient (a first layer's), as the C++
    calls (linear_ops.cpp) with the large product in one call and with its rows split over threads (as
    kernels/matmul_plan.py may plan it: 80 rows, two blocks of 64 and 16), and as the PyTorch calls used without
    a compiler."""
    if product == "PyTorch":
        monkeypatch.setattr(lora_module, "_ops", lambda wc: None)
    elif lora_module._ops(torch.empty(0)) is None:
        pytest.skip("needs the C++ extension (a C++ compiler)")
    if product == "C++ rows split":
        monkeypatch.setattr(lora_module, "row_parts", lambda a, b: 2)
    torch.manual_seed(0)
    out = sum(parts[0]) if parts else 5
    lin = torch.nn.Linear(6, out, bias=bias).double()
    lora = LoRALinear(lin, rank=3, alpha=4.5, parts=parts)
    with torch.no_grad():
        lora.lora_B.normal_()
    assert lora.lora_A.shape == (6 if parts else 3, 6) and lora.lora_B.shape == (9 if parts else 5, 3)
    x = torch.randn(2, 40, 6, dtype=torch.float64, requires_grad=need_x)
    assert torch.autograd.gradcheck(lambda x, a, b: _with(lora, a, b)(x), (x, lora.lora_A, lora.lora_B))
    g = torch.randn(2, 40, out, dtype=torch.float64)
    grads = []
    for path in ("hand", "autograd"):
        lora.dropout = torch.nn.Identity() if path == "hand" else torch.nn.Dropout(0.0)  # Dropout -> plain path
        x.grad = lora.lora_A.grad = lora.lora_B.grad = None
        y = lora(x)
        y.backward(g)
        grads.append((y.detach(), x.grad, lora.lora_A.grad, lora.lora_B.grad))
    assert (grads[0][1] is None) == (grads[1][1] is None) == (not need_x)
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(*grads) if a is not None)


def _with(lora, a, b):
    """The layer as a function of its adapter matrices (for gradcheck)."""
    def f(x):
        return torch.func.functional_call(lora, {"lora_A": a, "lora_B": b}, (x,))
    return f


@pytest.mark.parametrize("product", ["C++", "PyTorch"])
def test_bf16_autocast_path_matches_autograd_and_keeps_the_float32_master(product, monkeypatch):
    """Under bf16 autocast the hand-written product runs in bf16 from a cached copy of the frozen weight:
    output and gradients match autograd's own bf16 graph of the same layer, and the weight stays float32."""
    if product == "PyTorch":
        monkeypatch.setattr(lora_module, "_ops", lambda wc: None)
    torch.manual_seed(0)
    lora = LoRALinear(torch.nn.Linear(64, 48), rank=4, alpha=8)
    with torch.no_grad():
        lora.lora_B.normal_()
    x = torch.randn(3, 10, 64, requires_grad=True)
    outs = lora_bf16_paths(lora, x, torch.randn(3, 10, 48))
    for hand, ref in zip(*outs):
        assert (hand - ref).norm() <= 0.02 * ref.norm()  # bf16 rounding, not a different function
    assert lora.base.weight.dtype == torch.float32 and "_weight_copy" not in lora.state_dict()
    cw = lora._compute_weights(torch.bfloat16)
    w, sb = cw.weight, cw.sb
    assert w is lora._compute_weights(torch.bfloat16).weight and w.shape == (48, 64)  # cast once, reused
    assert torch.equal(w, lora.base.weight.to(torch.bfloat16)) and w.is_contiguous() and sb.is_contiguous()
    assert torch.equal(sb, (lora.lora_B * lora.scale).to(torch.bfloat16))
    opt = torch.optim.AdamW([lora.lora_A, lora.lora_B], lr=0.1, fused=True)
    opt.step()  # fused AdamW writes B without bumping its version counter: s B must follow anyway
    assert torch.equal(lora._compute_weights(torch.bfloat16).sb, (lora.lora_B * lora.scale).to(torch.bfloat16))
    assert lora._compute_weights(torch.bfloat16).sb is not sb  # a new tensor: an earlier forward's stays as it was
    with torch.no_grad():
        lora.base.weight.add_(1.0)  # a changed master (load_state_dict, an in-place write) is re-cast
    assert torch.equal(lora._compute_weights(torch.bfloat16).weight, lora.base.weight.to(torch.bfloat16))


def test_float32_holds_the_frozen_weight_once():
    """Computing in the master's own dtype, the product uses the master itself, not a copy: one storage, the same
    values, still the state_dict's weight; writes to it (load_state_dict) reach the product."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(40, 24)
    w0 = lin.weight.detach().clone()
    lora = LoRALinear(lin, rank=2, alpha=4)
    x = torch.randn(5, 40)
    y0 = lora(x)
    w = lora._compute_weights(torch.float32).weight
    assert w.data_ptr() == lin.weight.data_ptr()  # the master, detached: no copy
    assert torch.equal(lin.weight, w0) and torch.equal(lora.state_dict()["base.weight"], w0)
    assert torch.allclose(y0, x @ w0.t() + lin.bias, atol=1e-6)  # B = 0
    lora.load_state_dict({**lora.state_dict(), "base.weight": 2 * w0})
    assert torch.allclose(lora(x), x @ (2 * w0).t() + lin.bias, atol=1e-5)
    assert lora._compute_weights(torch.float32).weight is w


def _llama_pair(targets):
    """The same Llama twice with the same adapters on `targets`: as written (separate projections) and as the
    trainer builds it (q/k/v and gate/up fused first, one grouped adapter per fused layer)."""
    torch.manual_seed(0)
    plain = _model("llama")
    fused = Llama(plain.config).eval()
    fused.load_state_dict(plain.state_dict())
    inject_lora(plain, rank=4, alpha=8, targets=targets)
    _randomise_b(plain)
    fused.fuse_projections()
    names = inject_lora(fused, rank=4, alpha=8, targets=targets)
    pairs = []  # (grouped adapter, the separate adapters it stands for)
    with torch.no_grad():
        for name in names:
            layer, parent = fused.get_submodule(name), plain.get_submodule(name.rpartition(".")[0])
            originals = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
            parts = [getattr(parent, n) for n in originals.get(name.rsplit(".", 1)[-1], (name.rsplit(".", 1)[-1],))
                     if isinstance(getattr(parent, n), LoRALinear)]
            layer.lora_A.copy_(torch.cat([m.lora_A for m in parts]))
            layer.lora_B.copy_(torch.cat([m.lora_B for m in parts]))
            pairs.append((layer, parts))
    return plain, fused, names, pairs


@pytest.mark.parametrize("targets", [["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                                     ["q_proj", "v_proj", "up_proj"]])
def test_adapters_on_fused_projections_are_the_separate_adapters(targets):
    """One grouped adapter per fused layer (all or some of its parts adapted) computes, trains and merges exactly
    as separate adapters on the original projections; the merged model saves under the original names."""
    plain, fused, names, pairs = _llama_pair(targets)
    assert any(n.endswith(("qkv_proj", "gate_up_proj")) for n in names)
    assert sum(p.numel() for p in lora_parameters(plain)) == sum(p.numel() for p in lora_parameters(fused))
    x = _tokens()
    logits = [model(x)[0] for model in (plain, fused)]
    for out in logits:
        out.square().mean().backward()
    assert torch.allclose(logits[0], logits[1], atol=1e-6, rtol=0)
    for layer, parts in pairs:
        for ab in ("lora_A", "lora_B"):
            separate = torch.cat([getattr(m, ab).grad for m in parts])
            assert separate.abs().max() > 0 and torch.allclose(getattr(layer, ab).grad, separate, atol=1e-7, rtol=1e-4)
    a = merge_lora(plain).state_dict()
    b = merge_lora(fused).state_dict()
    assert set(a) == set(b) and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
