"""Training: token files in, a model directory out; two backends, one schedule, one batch sampler.

    tokenizer/shards.py wrote train.bin / val.bin (memory-mapped)
      -> batches.BatchSampler: seeded random windows; one global batch per step, sliced per rank / micro-batch
      -> loop.train (PyTorch): GPT -> AdamW (decoupled decay) + nn.schedule.lr_at + clipping,
         gradient accumulation, bf16/fp16 autocast (precision.py), torch.compile, DDP (distributed.py),
         checkpoints last.pt / best.pt with RNG + data position (checkpoint.py) -> bit-exact resume
      -> numpy_loop.train_numpy: the same steps on tinystack.nn's NumPy GPT (hand-written backward)
      -> a JSONL training log, a PNG loss curve (plot.py), a progress bar with loss, tokens/s and ETA
      -> checkpoint.save_model_dir: config.json + model.safetensors + tokenizer.json + tinystack.json
"""
from tinystack.train.batches import BatchSampler, eval_batches, get_batch
from tinystack.train.checkpoint import load_checkpoint, save_checkpoint, save_model_dir
from tinystack.train.loop import NonFiniteLossError, TrainResult, estimate_loss, make_optimizer, train

__all__ = ["BatchSampler", "NonFiniteLossError", "TrainResult", "estimate_loss", "eval_batches", "get_batch",
           "load_checkpoint", "make_optimizer", "save_checkpoint", "save_model_dir", "train"]
