"""Our engine against `transformers`, for GPT-2, Llama (GQA) and Qwen2 (QKV bias), float32."""
from __future__ import annotations

import torch
from infer_helpers import ToyTokenizer, random_prompts

from tinystack.infer import LLM, SamplingParams
from tinystack.infer.paged_cache import BatchView, KVStorage
from tinystack.model import load_model

LENGTHS = [5, 23, 1, 40, 17]


def _llm(model, **kw):
    kw.setdefault("memory_limit_mb", 1024)
    kw.setdefault("max_num_seqs", 4)
    return LLM(model, ToyTokenizer(), **kw)


@torch.no_grad()
def test_ragged_batch_logits_equal_transformers(family):
    """Different-length prompts packed into one row through the paged cache, in two prefill chunks
    and then a decode step, every position vs HF one prompt at a time."""
    kind, hf, d = family
    model = load_model(d)
    cfg = model.config
    prompts = random_prompts(LENGTHS, seed=1)
    bs, blocks_per = 16, 3
    storage = KVStorage(cfg.n_layer, len(prompts) * blocks_per + 1, bs, cfg.n_kv_head, cfg.head_dim)
    # row 0 in consecutive blocks (read as a view); the rest scattered in reversed order (gathered)
    tables = [[1, 2, 3]] + [[len(prompts) * blocks_per - (i * blocks_per + j) for j in range(blocks_per)]
                            for i in range(1, len(prompts))]
    cpu = torch.device("cpu")

    def packed_step(starts, lengths, rows):
        view = BatchView(storage, tables, starts, lengths, cpu)
        ids = torch.tensor([[t for r in rows for t in r]])
        logits, _ = model(ids, kv_cache=view, positions=view.positions)
        return [logits[0, o:o + n] for o, n in zip(view.offsets, lengths)], view

    cut = [max(1, len(p) // 2) for p in prompts]  # first chunk from 0, second from cut (a masked chunk)
    first, _ = packed_step([0] * len(prompts), cut, [p[:c] for p, c in zip(prompts, cut)])
    rest = [(c, len(p) - c, p[c:]) for p, c in zip(prompts, cut) if len(p) > c]
    idx = [i for i, (p, c) in enumerate(zip(prompts, cut)) if len(p) > c]
    saved = tables[:]
    tables[:] = [saved[i] for i in idx]
    second, view = packed_step([r[0] for r in rest], [r[1] for r in rest], [r[2] for r in rest])
    tables[:] = saved
    assert view.last_index.tolist() == [o + n - 1 for o, n in zip(view.offsets, [r[1] for r in rest])]
    for i, p in enumerate(prompts):
        theirs = hf(torch.tensor([p])).logits[0]
        ours = torch.cat([first[i]] + ([second[idx.index(i)]] if i in idx else []))
        assert torch.allclose(ours, theirs, atol=1e-4), (kind, i, (ours - theirs).abs().max())
    # and a decode step on top of the ragged cache: one new token per row, at different positions
    nxt = torch.randint(3, 200, (len(prompts),), generator=torch.Generator().manual_seed(2)).tolist()
    step, _ = packed_step([len(p) for p in prompts], [1] * len(prompts), [[t] for t in nxt])
    for i, p in enumerate(prompts):
        theirs = hf(torch.tensor([p + [nxt[i]]])).logits[0, -1]
        assert torch.allclose(step[i][0], theirs, atol=1e-4)


def test_32_greedy_tokens_equal_transformers_generate(family):
    kind, hf, d = family
    prompts = random_prompts([7, 30, 2], seed=3)
    outs = _llm(load_model(d), max_num_batched_tokens=16).generate(
        prompts, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
    for p, o in zip(prompts, outs):
        ref = hf.generate(torch.tensor([p]), max_new_tokens=32, do_sample=False, pad_token_id=0)[0, len(p):].tolist()
        assert o.token_ids == ref, kind
        assert o.finish_reason == "length"


@torch.no_grad()
def test_cache_decode_equals_full_recompute_and_paged_equals_contiguous(family):
    kind, _, d = family
    model = load_model(d)
    prompts = random_prompts([9, 33, 4], seed=4)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=3)
    paged = _llm(model, kv_cache="paged", kv_block_size=4, max_num_batched_tokens=12).generate(prompts, params)
    contiguous = _llm(model, kv_cache="contiguous").generate(prompts, params)
    for p, a, b in zip(prompts, paged, contiguous):
        seq = torch.tensor([p])
        for _ in range(16):  # recompute: the whole sequence every token, no cache
            seq = torch.cat([seq, model(seq)[0][:, -1].argmax(-1, keepdim=True)], dim=1)
        assert a.token_ids == seq[0, len(p):].tolist() == b.token_ids, kind
        for la, lb in zip(a.logprobs, b.logprobs):
            assert abs(la["logprob"] - lb["logprob"]) < 1e-4 and la["top"].keys() == lb["top"].keys()


def test_per_request_seed_reproduces_regardless_of_batch(family):
    kind, _, d = family
    model = load_model(d)
    target = random_prompts([12], seed=5)[0]
    sampled = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=20, seed=1234, ignore_eos=True)
    alone = _llm(model).generate([target], sampled)[0].token_ids
    others = random_prompts([3, 40, 25], seed=6)
    mixed_params = [SamplingParams(temperature=0, max_tokens=10),
                    SamplingParams(temperature=0.7, seed=9, max_tokens=30),
                    sampled, SamplingParams(temperature=1.3, top_k=5, max_tokens=5)]
    batch = _llm(model, max_num_batched_tokens=8).generate([others[0], others[1], target, others[2]], mixed_params)
    assert batch[2].token_ids == alone, kind
    again = _llm(model, kv_cache="contiguous").generate([target], sampled)[0].token_ids
    assert again == alone
    other_seed = _llm(model).generate([target], SamplingParams(**{**sampled.__dict__, "seed": 4321}))[0].token_ids
    assert other_seed != alone


def test_numpy_backend_equals_torch_backend(tmp_path):
    """runtime="numpy" drives issue 4's NumPy GPT (tinystack.nn.gpt): same logits within 1e-4, same tokens."""
    from infer_helpers import _hf_model

    from tinystack.infer.numpy_backend import load_numpy_model

    _hf_model("gpt2", seed=7).save_pretrained(tmp_path, safe_serialization=True)
    torch_model, np_model = load_model(tmp_path), load_numpy_model(tmp_path)
    for p in random_prompts([1, 13, 50], seed=8):
        with torch.no_grad():
            want = torch_model(torch.tensor([p]))[0][0, -1]
        assert torch.allclose(np_model.last_logits(p), want, atol=1e-4)
    prompts = random_prompts([6, 19], seed=9)
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=0.8, seed=3, max_tokens=12, ignore_eos=True)]
    a = _llm(torch_model).generate(prompts, params)
    b = LLM(tmp_path, ToyTokenizer(), runtime="numpy", memory_limit_mb=1024, max_num_seqs=4).generate(prompts, params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
