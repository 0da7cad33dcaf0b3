"""tinystack: an AI engineering pipeline built from scratch, end to end.

Data flows through the layers in this order, one sub-package each (nn/ is a side branch:
the NumPy backend that training can use instead of PyTorch):

    data/       raw text -> unified JSONL records -> clean, dedup, split (+ manifest)
    tokenizer/  train split -> byte-level BPE (tokenizer.json) -> token files (.bin)
    model/      the PyTorch GPT and Llama family, the model directory every later stage reads,
                and `model import` (HF / GGUF checkpoints -> a model directory)
    nn/         the NumPy backend: layers with hand-written backward, optimisers, the LR schedule
    train/      token windows -> AdamW training loop -> model directory; fine-tuning (full or LoRA)
    eval/       model + split -> loss, perplexity, bits per byte (eval.json), per-source blame,
                the regression and promotion gates, the model registry, reports
    infer/      model directory -> batched, KV-cached generation with sampling (LLMEngine)
    serve/      OpenAI-compatible HTTP API (FastAPI) around the inference engine
    observe/    per-request timing points, metrics, structured logs, traces, cost

`tinystack.pipeline` chains them (one stage per layer, in a work directory); `tinystack.cli` is
the one command line; `tinystack.config` holds every setting; `tinystack.kernels` builds and loads the C++
extensions.
"""

__version__ = "0.1.0"
