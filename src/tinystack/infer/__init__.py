"""Inference: model directories in, generated text out, many requests at once.

    LLM(model_dir) / AsyncEngine.from_dir(model_dir)          llm.py, async_engine.py
      load: model.io (ours, HF GPT-2, HF Llama family) + tokenizer.json (tinystack.tokenizer.load_tokenizer),
            weights kept quantised (quant/: bf16 | q8_0 | q4_0 | q4_1, dtype "auto" picks one per machine);
            backend "numpy" drives nn.gpt (numpy_backend.py)
      LLMEngine (llm_engine.py): the memory budget (memory.py) sizes the KV storage; weights and
        KV storage go into 2 MiB pages, the output head column-major (weight_arena.py); a thread
        faults in the KV storage's first pages (paged_cache.py; wait_for_kv_pages waits for it)
        add_request -> encode_prompt (the prompt rules) -> Sequence (sequence.py) -> scheduler queue
        step: Scheduler (scheduler.py: continuous batching, chunked prefill, preemption)
              or DynamicBatcher (batcher.py)      picks [(seq, n tokens)] within the budgets
              BlockManager (block_manager.py)      blocks, refcounts, prefix cache, LRU eviction
              Speculator (speculative.py)          optional draft tokens (prompt lookup or draft_model.py),
                                                   verified in the same forward, rolled back when rejected
              ModelRunner (model_runner.py)        ragged batch -> model over BatchView (paged_cache.py);
                                                   short steps -> FusedStep (fused_step.py: every
                                                   Llama layer in one C++ call, kernels/quant/fused_step.cpp)
              sample_batch (sampler.py)            per-request penalties / greedy / top-k / top-p / min-p, seeds
              -> TokenDelta / RequestOutput (outputs.py; RequestMetrics: the request's timing points)

This engine is the one inference path: `tinystack generate`, the server (AsyncEngine; unbatched
is max_num_seqs=1), evaluation (LLM.generate, one batch) and `tinystack bench kv` (bench.py: the
contiguous cache vs a no-cache Recompute wrapper, both on the engine) all run it.
"""
from tinystack.lazy import lazy_exports

_EXPORTS = {
    "AsyncEngine": "tinystack.infer.async_engine",
    "RequestStream": "tinystack.infer.async_engine",
    "LLM": "tinystack.infer.llm",
    "load_for_inference": "tinystack.infer.loading",
    "LLMEngine": "tinystack.infer.llm_engine",
    "PromptError": "tinystack.infer.llm_engine",
    "PromptTooLongError": "tinystack.infer.llm_engine",
    "AdmissionError": "tinystack.infer.memory",
    "MemoryBudget": "tinystack.infer.memory",
    "RequestMetrics": "tinystack.infer.outputs",
    "RequestOutput": "tinystack.infer.outputs",
    "TokenDelta": "tinystack.infer.outputs",
    "SamplingParams": "tinystack.sampling_params",
    "sample_batch": "tinystack.infer.sampler",
    "top_k_filter": "tinystack.infer.sampler",
    "top_p_filter": "tinystack.infer.sampler",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["AdmissionError", "AsyncEngine", "LLM", "LLMEngine", "MemoryBudget", "PromptError", "PromptTooLongError",
           "RequestMetrics", "RequestOutput", "RequestStream", "SamplingParams", "TokenDelta", "load_for_inference",
           "sample_batch", "top_k_filter", "top_p_filter"]
