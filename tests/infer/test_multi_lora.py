"""Many LoRA adapters from one engine (infer/lora.py): greedy tokens with adapter X equal those of the model with X
merged into its weights, token for token, for 3 adapters of different targets and ranks, with rows of the 3 and of
the base interleaved in the same batches; the prefix cache never hands one adapter's blocks to another, and does
to the same one; an adapter that does not fit is refused naming what differs; one in use is not unloaded."""
import copy

import pytest
import torch
from infer_helpers import VOCAB, ToyTokenizer

from tinystack.infer import LLM
from tinystack.model.llama import Llama, LlamaConfig
from tinystack.model.lora_adapter import LoRAAdapter
from tinystack.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
ATTN, MLP = ("q_proj", "k_proj", "v_proj", "o_proj"), ("gate_proj", "up_proj", "down_proj")
# (targets, rank, alpha): q/v only (PEFT's default), every projection, the MLP only
SPECS = {"qv": (("q_proj", "v_proj"), 4, 8.0), "all": (ATTN + MLP, 8, 8.0), "mlp": (MLP, 2, 4.0)}


def _base() -> Llama:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=80, n_layer=2, n_head=4, n_kv_head=2,
                      max_position_embeddings=160)
    return Llama(cfg).eval()


def _adapter(base: Llama, targets, rank: int, alpha: float, seed: int) -> LoRAAdapter:
    g = torch.Generator().manual_seed(seed)
    weights = {}
    for path, module in base.named_modules():
        if path.rsplit(".", 1)[-1] in targets:
            out_f, in_f = module.weight.shape
            weights[path] = (torch.randn(rank, in_f, generator=g) * 0.5, torch.randn(out_f, rank, generator=g) * 0.5)
    return LoRAAdapter(weights, rank, alpha / rank)


def _merged(base: Llama, adapter: LoRAAdapter) -> Llama:
    model = copy.deepcopy(base)
    with torch.no_grad():
        for path, (a, b) in adapter.weights.items():
            model.get_submodule(path).weight += adapter.scale * b @ a
    return model


def _llm(model: Llama) -> LLM:
    return LLM(copy.deepcopy(model), ToyTokenizer(), weight_format="float32", memory_limit_mb=256)


def _tokens(outputs) -> list[list[int]]:
    return [o.token_ids for o in outputs]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    base, loaded = _base(), {}
    for i, (name, spec) in enumerate(SPECS.items()):
        path = tmp_path_factory.mktemp(name)
        _adapter(base, *spec, seed=i).save(path)
        loaded[name] = LoRAAdapter.load(path)  # through PEFT's layout on disk, as a server loads one
    return base, loaded


def test_each_adapters_tokens_equal_its_merged_model_in_mixed_batches(adapters):
    base, made = adapters
    shared = "the same long prompt that fills more than two blocks of sixteen tokens"  # 69 tokens: 4 full blocks
    prompts = [shared, "another prompt, shorter", "a third one"]
    expected = {None: _tokens(_llm(base).generate(prompts, GREEDY))}
    for name, adapter in made.items():
        expected[name] = _tokens(_llm(_merged(base, adapter)).generate(prompts, GREEDY))
        assert expected[name] != expected[None], name  # each adapter really changes the answers

    llm = _llm(base)
    for name, adapter in made.items():
        llm.engine.add_lora(name, adapter.path)  # PEFT's directory
    # the shared prompt cached under one adapter first: later rows of the others must not reuse its blocks
    assert _tokens(llm.generate([shared], GREEDY, lora="qv")) == [expected["qv"][0]]
    hits = llm.engine.prefix_cache_hit_tokens
    order = [None, "qv", "all", "mlp"] * 3  # every prompt under every adapter, interleaved in one batch
    rows = [(a, i) for i in range(len(prompts)) for a in order[i:i + 4]]
    got = _tokens(llm.generate([prompts[i] for _, i in rows], GREEDY, lora=[a for a, _ in rows]))
    for (a, i), tokens in zip(rows, got):
        assert tokens == expected[a][i], (a, i)
    assert llm.engine.prefix_cache_hit_tokens >= hits + 64  # the same adapter (qv) did reuse its 4 blocks
    # two of the three resident adapters in a batch (the projections' stacks cut to those two), evenly or not
    for rows in ([("mlp", 1), ("qv", 2), ("mlp", 2), ("qv", 1)], [("all", 0), ("mlp", 1), ("mlp", 2), ("all", 2)]):
        got = _tokens(llm.generate([prompts[i] for _, i in rows], GREEDY, lora=[a for a, _ in rows]))
        assert got == [expected[a][i] for a, i in rows], rows


def test_an_adapter_that_does_not_fit_is_refused_naming_what_differs(adapters):
    base, made = adapters
    llm = _llm(base)
    a, b = made["qv"].weights["model.layers.0.self_attn.q_proj"]
    wrong_shape = LoRAAdapter({"model.layers.0.self_attn.q_proj": (a[:, :10], b)}, 4, 2.0)
    with pytest.raises(ValueError, match=r"q_proj has A \(4, 10\).*needs A \(4, 48\)"):
        llm.engine.add_lora("x", wrong_shape)
    with pytest.raises(ValueError, match="model.layers.7.self_attn.q_proj, which this base model does not have"):
        llm.engine.add_lora("x", LoRAAdapter({"model.layers.7.self_attn.q_proj": (a, b)}, 4, 2.0))
    with pytest.raises(ValueError, match="max_lora_rank is 64"):
        llm.engine.add_lora("x", LoRAAdapter({"model.layers.0.self_attn.q_proj": (torch.zeros(65, 48),
                                                                                  torch.zeros(192, 65))}, 65, 1.0))
    with pytest.raises(ValueError, match="no LoRA adapter named 'nope' is loaded"):
        llm.generate(["hi"], GREEDY, lora="nope")
    llm.engine.add_lora("qv", made["qv"])
    with pytest.raises(ValueError, match="already loaded"):
        llm.engine.add_lora("qv", made["qv"])


def test_an_adapter_in_use_is_not_unloaded_and_a_reloaded_one_starts_afresh(adapters):
    base, made = adapters
    llm = _llm(base)
    llm.engine.add_lora("a", made["all"])
    llm.engine.add_request("r1", "some prompt", GREEDY, lora="a")
    with pytest.raises(ValueError, match="in use by 1 request"):
        llm.engine.remove_lora("a")
    while llm.engine.has_unfinished():
        llm.engine.step(flush=True)
    llm.engine.remove_lora("a")
    assert llm.engine.lora_names == []
    llm.engine.add_lora("a", made["mlp"])  # the same name, other weights: a new key, so nothing cached is reused
    assert _tokens(llm.generate(["some prompt"], GREEDY, lora="a")) == \
        _tokens(_llm(_merged(base, made["mlp"])).generate(["some prompt"], GREEDY))


def test_a_new_version_replaces_an_adapter_without_cutting_its_running_requests(adapters):
    """add_lora(replace=True), what a server following the registry does on a promotion: the request running
    with the old version ends with the old version's tokens, a request added after gets the new one's, and the
    old version's weights are freed once its last request ends."""
    base, made = adapters
    want = {name: _tokens(_llm(_merged(base, made[name])).generate(["some prompt"], GREEDY))[0]
            for name in ("qv", "all")}
    llm = _llm(base)
    engine = llm.engine
    engine.add_lora("a", made["qv"])
    old = engine.loras.keys["a"]
    engine.add_request("r-old", "some prompt", GREEDY, lora="a")
    got: dict[str, list[int]] = {"r-old": [], "r-new": []}

    def step():
        for delta in engine.step(flush=True):
            got[delta.request_id] += delta.token_ids

    for _ in range(3):
        step()
    engine.add_lora("a", made["all"], replace=True)
    assert engine.loras.keys["a"] != old and old in engine.loras.resident  # still running with it
    engine.add_request("r-new", "some prompt", GREEDY, lora="a")
    while engine.has_unfinished():
        step()
    assert got == {"r-old": want["qv"], "r-new": want["all"]}
    step()  # a step with nothing running frees the retired version
    assert old not in engine.loras.resident and engine.lora_names == ["a"]
    with pytest.raises(ValueError, match="max_lora_rank"):  # a replacement that does not fit leaves the old
        engine.add_lora("a", LoRAAdapter({"model.layers.0.self_attn.q_proj": (torch.zeros(65, 48),
                                                                              torch.zeros(192, 65))}, 65, 1.0),
                        replace=True)
    assert _tokens(llm.generate(["some prompt"], GREEDY, lora="a")) == [want["all"]]
