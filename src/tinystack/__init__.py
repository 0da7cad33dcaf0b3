"""tinystack: an AI engineering pipeline built from scratch, end to end.

Data flows through six layers, one sub-package each:

    data/       raw text -> unified JSONL records -> clean, dedup, split (+ manifest)
    tokenizer/  train split -> byte-level BPE (encode/decode)
    nn/         the NumPy backend: layers with hand-written backward, optimisers, LR schedule
    model/      the PyTorch GPT and the model directory format shared by every later stage
    train/      token windows -> AdamW training loop -> checkpoint in the model directory
    eval/       model + split -> loss, perplexity, bits per byte (eval.json)
    infer/      model directory -> KV-cached generation with sampling
    serve/      HTTP API (FastAPI) around the inference engine
    observe/    per-request timing points and structured logs

`tinystack.pipeline` chains them; `tinystack.cli` is the one command line.
"""

__version__ = "0.1.0"
