"""The fused step (infer/fused_step.py, kernels/quant/fused_step.cpp) against the model's own forward over the
BatchView: same logits and the same keys/values written, for every weight format, GQA, biases, scattered paged
blocks, mixed contexts, prefill chunks beside decodes and speculative verification rows; greedy generation through
it gives the tokens of the unfused engine; a token's logits are the same bits whether it came as a decode or inside
a verification row (what makes speculative decoding exactly greedy); rows of different LoRA adapters and of the
base in one step add each its own delta, as the forward does; and a model with an op, a module or a config
feature the step was not written for (or adapters in a dtype it does not take) is refused (with the reason) and
runs through its own forward."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from infer_helpers import VOCAB, ToyTokenizer, random_prompts

from tinystack.infer import LLM, SamplingParams
from tinystack.infer.fused_step import SUPPORTS, FusedStep
from tinystack.infer.lora import AdapterSet
from tinystack.infer.model_runner import ModelRunner
from tinystack.infer.paged_cache import KVStorage
from tinystack.infer.quant.formats import FORMATS
from tinystack.infer.quant.linear import quantize_model
from tinystack.infer.sequence import Sequence
from tinystack.kernels import quant as quant_kernels
from tinystack.model.llama import MLP, Llama, LlamaConfig
from tinystack.model.lora_adapter import LoRAAdapter
from tinystack.sampling_params import SamplingParams as Params

pytestmark = pytest.mark.skipif(quant_kernels.extension() is None, reason="needs the C++ extension (a C++ compiler)")


def _llama(bias: bool, fmt: str, seed: int = 0, rope_scaling: dict | None = None, qk_norm: bool = False) -> Llama:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, n_layer=3, n_head=6, n_kv_head=2,
                      head_dim=16, max_position_embeddings=256, attention_bias=bias, mlp_bias=bias,
                      rope_scaling=rope_scaling, qk_norm=qk_norm, model_type="qwen3" if qk_norm else "llama")
    model = Llama(cfg).eval()
    with torch.no_grad():  # random init zeroes biases and sets norm gains to 1; make both matter
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
    if fmt != "float32":
        quantize_model(model, fmt)
    return model


def _runner(model: Llama, fused: bool, bs: int = 4, n_blocks: int = 128) -> ModelRunner:
    storage = KVStorage(3, n_blocks, bs, 2, 16, hugepages=False)
    return ModelRunner(copy.deepcopy(model), storage, hugepages=False, fused_step=fused)


def _sequences(starts: list[int], bs: int, seed: int) -> list[Sequence]:
    """Sequences with `starts` tokens computed and one more to feed, on scattered (non-consecutive) blocks."""
    order = torch.randperm(95, generator=torch.Generator().manual_seed(seed)).add(1).tolist()
    seqs, at = [], 0
    for i, (s, ids) in enumerate(zip(starts, random_prompts([s + 1 for s in starts], seed=seed))):
        seq = Sequence(str(i), "", ids, Params(max_tokens=1), max_new_tokens=1)
        k = -(-(s + 1) // bs)
        seq.block_table, at = order[at:at + k], at + k
        seqs.append(seq)
    return seqs


def _prefilled(model: Llama, starts: list[int], seed: int) -> tuple[ModelRunner, ModelRunner, list[Sequence]]:
    """A fused and an unfused runner whose caches hold the same histories (prefilled through the model's forward
    in both, one long step), and the sequences with `starts` tokens computed."""
    fused, ref = _runner(model, True), _runner(model, False)
    seqs = _sequences(starts, 4, seed)
    for runner in (fused, ref):
        runner.fused, kept = None, runner.fused
        runner.run([(seq, s) for seq, s in zip(seqs, starts) if s > 0])
        runner.fused = kept
    for seq, s in zip(seqs, starts):
        seq.num_computed = s
    return fused, ref, seqs


def _extend(seqs: list[Sequence], n: int) -> None:
    """n more tokens per sequence, and blocks for them from 96 up (_sequences hands out 1..95)."""
    free = iter(range(96, 128))
    for i, seq in enumerate(seqs):
        seq.token_ids += random_prompts([n], seed=10 + i)[0]
        while len(seq.block_table) * 4 < len(seq.token_ids):
            seq.block_table.append(next(free))


def _assert_close(got: torch.Tensor, want: torch.Tensor, fmt: str) -> None:
    tol = 1e-4 if fmt in ("float32", "bf16") else 2e-3  # the quantised kernels round activations to int8
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("fmt", ["float32", *FORMATS])
@pytest.mark.parametrize("bias, qk_norm", [(False, False), (True, False), (False, True)],
                         ids=["llama", "biases", "qwen3-qk-norm"])
@torch.no_grad()
def test_fused_step_equals_the_model_forward(fmt, bias, qk_norm):
    model = _llama(bias, fmt, qk_norm=qk_norm)  # norm gains random: Qwen3's q/k norms matter
    starts = [0, 9, 30, 3, 17]
    fused, ref, seqs = _prefilled(model, starts, seed=1)
    assert fused.fused is not None and ref.fused is None
    for rows in (seqs, seqs[2:3]):  # a batch of decodes, and batch 1
        assert fused.fused.accepts(len(rows))
        got, want = fused.run([(seq, 1) for seq in rows]), ref.run([(seq, 1) for seq in rows])
        assert got.shape == want.shape == (len(rows), VOCAB)
        _assert_close(got, want, fmt)
    torch.testing.assert_close(fused.storage.k, ref.storage.k, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fused.storage.v, ref.storage.v, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt", ["float32", "q8_0"])
@torch.no_grad()
def test_prefill_chunks_and_verification_rows_equal_the_model_forward(fmt):
    model = _llama(True, fmt, seed=4)
    starts = [0, 9, 30, 3]
    fused, ref, seqs = _prefilled(model, starts, seed=5)
    _extend(seqs, 12)
    batch = [(seqs[0], 7), (seqs[1], 1), (seqs[2], 3), (seqs[3], 1)]  # a chunk from 0, decodes, a chunk mid-way
    drafts = [[], [5, 6, 7], [], [9]]
    _assert_close(fused.run(batch, drafts), ref.run(batch, drafts), fmt)
    _assert_close(fused.run(batch), ref.run(batch), fmt)
def _adapter(model: Llama, targets: tuple[str, ...], rank: int, seed: int) -> LoRAAdapter:
    g = torch.Generator().manual_seed(seed)
    weights = {path: (torch.randn(rank, m.in_features, generator=g) * 0.3,
                      torch.randn(m.out_features, rank, generator=g) * 0.3)
               for path, m in model.named_modules() if path.rsplit(".", 1)[-1] in targets}
    return LoRAAdapter(weights, rank, 2.0 / rank)


@pytest.mark.parametrize("fmt", ["float32", "q4_1"])
@torch.no_grad()
def test_adapter_rows_through_the_fused_step_equal_the_model_forward(fmt):
    """Two adapters (q/v at rank 4; every projection at rank 8) and the base, in decodes and a prefill chunk of one
    step: the fused step's logits and written keys/values are the forward's. A resident set that changes (the
    widest adapter unloaded) reaches the C++ before the next step."""
    model = _llama(False, "float32", seed=3)  # adapters are made for the float model's projections
    made = {"qv": _adapter(model, ("q_proj", "v_proj"), 4, 1),
            "all": _adapter(model, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), 8, 2)}
    if fmt != "float32":
        quantize_model(model, fmt)
    starts = [0, 9, 30, 3, 17]
    fused, ref, seqs = _runner(model, True), _runner(model, False), _sequences(starts, 4, seed=4)
    for runner in (fused, ref):
        runner.loras = AdapterSet(runner.model, 4, 64)
        keys = {name: runner.loras.add(name, adapter) for name, adapter in made.items()}
    for seq, name in zip(seqs, ["qv", None, "all", "all", "qv"]):
        seq.lora_key = keys[name] if name else 0
    for runner in (fused, ref):  # the histories through the forward, in both
        runner.fused, kept = None, runner.fused
        runner.run([(seq, s) for seq, s in zip(seqs, starts) if s > 0])
        runner.fused = kept
    for seq, s in zip(seqs, starts):
        seq.num_computed = s
    calls = []
    real = fused.fused.run
    fused.fused.run = lambda *a: calls.append(a) or real(*a)
    rows = [(seqs[0], 1), (seqs[1], 1), (seqs[2], 1), (seqs[3], 1), (seqs[4], 1)]
    _assert_close(fused.run(rows), ref.run(rows), fmt)
    assert len(calls) == 1 and sorted(set(calls[0][5])) == [-1, 0, 1]  # one fused call: base and both adapters
    torch.testing.assert_close(fused.storage.k, ref.storage.k, rtol=1e-4, atol=1e-4)
    for runner in (fused, ref):
        runner.loras.remove("all")  # the stacks narrow to rank 4, and "qv" stays at place 0
    for seq in seqs:
        seq.num_computed += 1
        seq.lora_key = keys["qv"] if seq.lora_key == keys["all"] else seq.lora_key
    _extend(seqs, 3)
    rows = [(seqs[0], 3), (seqs[2], 1), (seqs[3], 1)]  # a 3-token chunk beside two decodes
    _assert_close(fused.run(rows), ref.run(rows), fmt)
    assert len(calls) == 2 and sorted(set(calls[1][5])) == [0]


@torch.no_grad()
def test_adapter_stacks_the_fused_step_does_not_take_run_through_the_forward():
    model = _llama(False, "float32")
    runner, ref = _runner(model, True), _runner(model, False)
    adapter = _adapter(model, ("q_proj", "down_proj"), 4, 5)
    for r, dtype in ((runner, torch.bfloat16), (ref, torch.bfloat16)):
        r.loras = AdapterSet(r.model, 2, 64)
        r.loras.dtype = dtype  # adapters kept in bfloat16: the C++ reads float32 stacks only
        key = r.loras.add("a", adapter)
    assert not runner.fused.take_loras(runner.loras)
    seqs = _sequences([1, 1], 4, seed=6)
    for seq in seqs:
        seq.lora_key = key
    assert runner.fused.accepts(4)
    torch.testing.assert_close(runner.run([(seq, 2) for seq in seqs]), ref.run([(seq, 2) for seq in seqs]))


@pytest.mark.parametrize("fmt", FORMATS)
@torch.no_grad()
def test_a_verification_row_gives_the_bits_of_one_decode_at_a_time(fmt):
    """The quantised kernels compute each activation row on its own, in one order, whatever the row count. (Float32
    layers call torch's GEMM, whose summation order may change with the row count: equal within rounding there.)"""
    model = _llama(False, fmt, seed=8)
    a, _, seqs_a = _prefilled(model, [21], seed=9)
    b, _, seqs_b = _prefilled(model, [21], seed=9)
    (sa,), (sb,) = seqs_a, seqs_b
    _extend([sa], 4)
    _extend([sb], 4)
    drafts = sa.token_ids[22:25]
    verified = a.run([(sa, 1)], [drafts])  # [last token, d1, d2, d3] in one step -> 4 logits rows
    one_by_one = []
    for _ in range(4):
        one_by_one.append(b.run([(sb, 1)])[0])
        sb.num_computed += 1
    assert torch.equal(verified, torch.stack(one_by_one))


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}


@pytest.mark.parametrize("fmt, rope, qk_norm", [("float32", None, False), ("q4_1", None, False),
                                                 ("float32", LLAMA3_ROPE, False), ("q4_1", None, True)],
                         ids=["float32", "q4_1", "llama3-rope", "qwen3-q4_1"])
def test_greedy_generation_with_and_without_the_fused_step(fmt, rope, qk_norm):
    model = _llama(True, fmt, seed=3, rope_scaling=rope, qk_norm=qk_norm)  # llama3: the scaled table
    prompts = random_prompts([3, 17, 1, 40, 9, 25], seed=7)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)

    def generate(fused: bool):
        llm = LLM(copy.deepcopy(model), ToyTokenizer(), memory_limit_mb=1024, max_num_seqs=6, kv_block_size=4)
        assert llm.engine.runner.fused is not None
        if not fused:
            llm.engine.runner.fused = None  # every step through the model's forward
        return [o.token_ids for o in llm.generate(prompts, params)]

    assert generate(True) == generate(False)


class _GeluMLP(MLP):
    """An MLP with an op the fused step does not know: GELU where fused_step.cpp computes SiLU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.gelu(gate) * up)


@dataclasses.dataclass
class _WindowConfig(LlamaConfig):
    sliding_window: int = 8  # a config feature the fused step does not implement


@torch.no_grad()
def test_a_model_with_an_op_the_fused_step_does_not_know_is_refused_and_decodes_through_its_forward():
    plain, gelu = _llama(False, "float32", seed=11), _llama(False, "float32", seed=11)
    for block in gelu.model.layers:
        block.mlp.__class__ = _GeluMLP
    for m in (plain, gelu):
        m.fuse_projections()  # as the runner does (_GeluMLP reads the fused gate_up_proj)
    assert _runner(plain, True).fused is not None  # the same model with SiLU takes the fused step
    reason = FusedStep.refusal(gelu, KVStorage(3, 8, 4, 2, 16, hugepages=False), torch.device("cpu"))
    assert reason is not None and "_GeluMLP" in reason
    starts = [9, 4, 0]
    runner, _, seqs = _prefilled(gelu, starts, seed=12)
    assert runner.fused is None
    got = runner.run([(seq, 1) for seq in seqs])  # one decode step each, through the model's forward
    for row, (seq, s) in enumerate(zip(seqs, starts)):
        ids = torch.tensor([seq.token_ids[:s + 1]])
        torch.testing.assert_close(got[row], gelu(ids)[0][0, -1], rtol=1e-4, atol=1e-4)
        assert not torch.allclose(got[row], plain(ids)[0][0, -1], atol=1e-3)  # SiLU would have been wrong


@torch.no_grad()
def test_config_features_and_caches_it_was_not_written_for_are_refused(monkeypatch):
    model = _llama(True, "q8_0", seed=13)
    model.fuse_projections()
    storage, cpu = KVStorage(3, 8, 4, 2, 16, hugepages=False), torch.device("cpu")
    assert FusedStep.refusal(model, storage, cpu) is None

    def refusal(**change) -> str:
        m = copy.deepcopy(model)
        config = change.pop("config", None)
        if config is not None:
            m.config = config
        for key, value in change.items():
            setattr(m.config, key, value)
        reason = FusedStep.refusal(m, storage, cpu)
        assert reason is not None and FusedStep.build(m, storage, cpu) is None
        return reason

    assert "_WindowConfig" in refusal(config=_WindowConfig(**model.config.to_dict()))
    assert "'gemma'" in refusal(model_type="gemma")
    assert "'yarn'" in refusal(rope_scaling={"rope_type": "yarn", "factor": 4.0})
    monkeypatch.setitem(SUPPORTS, "config_fields", SUPPORTS["config_fields"] - {"mlp_bias"})
    assert "mlp_bias" in refusal()
    monkeypatch.undo()
    bf16 = KVStorage(3, 8, 4, 2, 16, dtype=torch.bfloat16, hugepages=False)
    assert "float32 KV cache" in FusedStep.refusal(model, bf16, cpu)
    unfused = _llama(True, "q8_0", seed=13)
    assert "not fused" in FusedStep.refusal(unfused, storage, cpu)
