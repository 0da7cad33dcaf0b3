"""Inference: model directories in, generated text out, many requests at once.

    LLM(model_dir) / AsyncEngine.from_dir(model_dir)          llm.py, async_engine.py
      load: model.io (ours, HF GPT-2, HF Llama family) + tokenizer.json (tokenizer.py),
            optional INT8 weights (quant.py); backend "numpy" drives nn.gpt (numpy_backend.py)
      LLMEngine (llm_engine.py): the memory budget (memory.py) sizes the KV storage
        add_request -> Sequence (sequence.py) -> scheduler queue
        step: Scheduler (scheduler.py: continuous batching, chunked prefill, preemption)
              or DynamicBatcher (batcher.py)      picks [(seq, n tokens)] within the budgets
              BlockManager (block_manager.py)      blocks, refcounts, prefix cache, LRU eviction
              ModelRunner (model_runner.py)        ragged batch -> model over BatchView (paged_cache.py)
              sample_batch (sampler.py)            per-request penalties / greedy / top-k / top-p / min-p, seeds
              -> TokenDelta / RequestOutput (outputs.py)
    Engine (engine.py): the single-request blocking contract the server uses today, with the
    contiguous per-call KVCache (kv_cache.py).
"""
from tinystack.infer.async_engine import AsyncEngine, RequestStream
from tinystack.infer.engine import Engine, Generation
from tinystack.infer.kv_cache import CacheFullError, KVCache
from tinystack.infer.llm import LLM, load_for_inference
from tinystack.infer.llm_engine import LLMEngine, PromptTooLongError
from tinystack.infer.memory import AdmissionError, MemoryBudget
from tinystack.infer.outputs import RequestMetrics, RequestOutput, TokenDelta
from tinystack.infer.sampler import SamplingParams, sample_batch, sample_next, top_k_filter, top_p_filter

__all__ = ["AdmissionError", "AsyncEngine", "CacheFullError", "Engine", "Generation", "KVCache", "LLM", "LLMEngine",
           "MemoryBudget", "PromptTooLongError", "RequestMetrics", "RequestOutput", "RequestStream",
           "SamplingParams", "TokenDelta", "load_for_inference", "sample_batch", "sample_next", "top_k_filter",
           "top_p_filter"]
