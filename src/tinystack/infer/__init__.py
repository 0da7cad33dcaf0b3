"""Inference: a model directory in, generated text out.

    model_dir -> Engine.from_dir (model.io + tokenizer)
    prompt -> encode -> prefill fills KVCache (kv_cache.py) -> decode loop:
        logits -> sample_next (sampler.py: greedy / temperature / top-k / top-p, seeded)
    -> Generation(text, token_ids, finish_reason, prefill/decode seconds)
"""
from tinystack.infer.engine import Engine, Generation, PromptTooLongError
from tinystack.infer.kv_cache import CacheFullError, KVCache
from tinystack.infer.sampler import SamplingParams, sample_next, top_k_filter, top_p_filter

__all__ = ["CacheFullError", "Engine", "Generation", "KVCache", "PromptTooLongError", "SamplingParams",
           "sample_next", "top_k_filter", "top_p_filter"]
