"""The weight arena: the engine's weights and KV cache in 2 MiB pages, the head column-major,
without changing a single output, a tie or a saved file."""
from __future__ import annotations

import torch
from infer_helpers import ToyTokenizer

from tinystack.config import InferConfig
from tinystack.infer import LLMEngine, SamplingParams
from tinystack.infer.paged_cache import KVStorage
from tinystack.infer.weight_arena import HUGE_PAGE, hugepage_empty, hugepages_available, place_weights
from tinystack.model import GPT, GPTConfig
from tinystack.model.io import load_model, save_model
from tinystack.model.llama import Llama, LlamaConfig


def _anon_huge_kb(address: int) -> int:
    """AnonHugePages (kB) of the mapping of this process that contains `address`."""
    inside, found = False, 0
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("AnonHugePages:"):
                found = int(line.split()[1])
    return found


def _gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)  # ~3.7 MB of weights: more than one 2 MiB page
    return GPT(GPTConfig(vocab_size=4096, block_size=64, n_layer=2, n_head=4, n_embd=128)).eval()


def test_hugepage_buffer_is_zeroed_aligned_and_backed_by_2mib_pages():
    buf = hugepage_empty(3 * HUGE_PAGE + 100)
    assert buf.dtype == torch.uint8 and buf.numel() == 3 * HUGE_PAGE + 100
    assert int(buf.sum()) == 0
    buf.fill_(7)  # touching the pages is what allocates them
    assert int(buf[-1]) == 7
    if hugepages_available():
        assert buf.data_ptr() % HUGE_PAGE == 0
        assert _anon_huge_kb(buf.data_ptr()) >= 2048, "the kernel did not back the arena with huge pages"
    plain = hugepage_empty(3 * HUGE_PAGE, hugepages=False).fill_(1)
    if hugepages_available():  # the control asked for 4 KiB pages (MADV_NOHUGEPAGE holds under "always" too)
        assert int(plain.sum()) == plain.numel() and _anon_huge_kb(plain.data_ptr()) == 0


def test_placing_weights_changes_no_output_tie_or_parameter():
    model = _gpt()
    ids = torch.randint(0, 4096, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids)[0]
    params = dict(model.named_parameters())
    report = place_weights(model)
    assert report is not None and report.tensors == len(params) + len(list(model.buffers()))
    assert report.column_major_head and report.hugepages == hugepages_available()
    with torch.no_grad():
        after = model(ids)[0]
    torch.testing.assert_close(after, before, rtol=0, atol=1e-5)
    assert all(p is params[n] for n, p in model.named_parameters())  # same Parameter objects
    assert model.lm_head.weight is model.transformer.wte.weight  # still tied: one tensor, moved once
    head = model.lm_head.weight
    assert head.stride() == (1, head.shape[0])  # column-major: W.T is the contiguous one
    lo = model._weight_arena.data_ptr()
    hi = lo + model._weight_arena.numel()
    assert all(lo <= p.data_ptr() < hi for p in model.parameters())
    assert "_weight_arena" not in model.state_dict()
    assert place_weights(model) is None  # placed once


def test_a_placed_model_saves_and_loads_to_the_same_logits(tmp_path):
    model = _gpt(seed=3)
    place_weights(model)
    save_model(model, tmp_path / "m")
    again = load_model(tmp_path / "m").eval()
    ids = torch.arange(20)[None]
    with torch.no_grad():
        torch.testing.assert_close(again(ids)[0], model(ids)[0], rtol=0, atol=1e-5)


def test_untied_llama_head_is_placed_column_major_and_outputs_hold():
    torch.manual_seed(2)
    model = Llama(LlamaConfig(vocab_size=3000, hidden_size=128, intermediate_size=256, n_layer=2,
                              n_head=4, n_kv_head=2, max_position_embeddings=64,
                              tie_word_embeddings=False)).eval()
    ids = torch.randint(0, 3000, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids)[0]
    place_weights(model)
    assert model.lm_head.weight.stride() == (1, 3000)
    with torch.no_grad():
        torch.testing.assert_close(model(ids)[0], before, rtol=0, atol=1e-5)


def test_engine_output_is_the_same_with_and_without_hugepages():
    outs = []
    for huge in (True, False):
        eng = LLMEngine(_gpt(seed=4), ToyTokenizer(), InferConfig(memory_limit_mb=1024, kv_block_size=8,
                                                                  num_kv_blocks=64, hugepages=huge))
        assert eng.runner.arena is not None and eng.runner.arena.hugepages == (huge and hugepages_available())
        eng.add_request("a", "a prompt long enough to span blocks", SamplingParams(temperature=0, max_tokens=12))
        eng.add_request("b", "short", SamplingParams(temperature=0.8, seed=3, max_tokens=12))
        got = {}
        while eng.has_unfinished():
            for d in eng.step():
                if d.output is not None:
                    got[d.request_id] = d.output.token_ids
        outs.append(got)
    assert outs[0] == outs[1] and all(len(v) > 0 for v in outs[0].values())


def test_kv_storage_in_hugepages_is_zeroed_in_every_dtype():
    for dtype in (torch.float32, torch.bfloat16):
        st = KVStorage(n_layer=2, num_blocks=64, block_size=16, n_kv_head=4, head_dim=64, dtype=dtype)
        assert st.k.shape == (2, 4, 64, 16, 64) and st.k.dtype == dtype and st.v.dtype == dtype
        assert st.k.is_contiguous() and not st.k.any() and not st.v.any()
        st.k[1, :, 3].fill_(1.5)  # writable (layer 1, block 3), and K and V do not share memory
        assert not st.v.any() and float(st.k.sum()) == 1.5 * 16 * 4 * 64
