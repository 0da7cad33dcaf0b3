"""Decoding through the KV cache must give the logits of recomputing the whole sequence."""
import pytest
import torch

from tinystack.infer import CacheFullError, KVCache
from tinystack.model import GPT, GPTConfig


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=61, block_size=48, n_layer=3, n_head=4, n_embd=32)).eval()


@torch.no_grad()
def test_prefill_then_decode_equals_full_recompute(model):
    seq = torch.randint(0, 61, (2, 40), generator=torch.Generator().manual_seed(1))
    full, _ = model(seq)
    cache = KVCache.for_model(model.config, batch=2)
    prompt = 17
    logits, _ = model(seq[:, :prompt], kv_cache=cache, start_pos=0)
    got = [logits]
    for t in range(prompt, seq.size(1)):
        logits, _ = model(seq[:, t:t + 1], kv_cache=cache, start_pos=t)
        got.append(logits)
    assert torch.allclose(torch.cat(got, dim=1), full, atol=1e-5)
    assert cache.length == seq.size(1)


@torch.no_grad()
def test_chunked_prefill_equals_full_recompute(model):
    """Several tokens at once on top of a filled cache need the offset causal mask."""
    seq = torch.randint(0, 61, (1, 30), generator=torch.Generator().manual_seed(2))
    full, _ = model(seq)
    cache = KVCache.for_model(model.config)
    parts = [model(seq[:, a:b], kv_cache=cache, start_pos=a)[0] for a, b in ((0, 7), (7, 19), (19, 30))]
    assert torch.allclose(torch.cat(parts, dim=1), full, atol=1e-5)


def test_cache_refuses_to_overflow(model):
    cache = KVCache.for_model(model.config, max_len=8)
    assert cache.nbytes == 2 * 3 * 1 * 4 * 8 * 8 * 4  # K and V, layers*batch*heads*len*head_dim, fp32
    with pytest.raises(CacheFullError, match="holds 8 positions"):
        model(torch.zeros(1, 9, dtype=torch.long), kv_cache=cache)
