"""Training: token files in, a model directory out; two backends, one schedule, one batch sampler.

    tokenizer/shards.py wrote train.bin / val.bin (memory-mapped)
      -> batches.BatchSampler: seeded random windows; one global batch per step, sliced per rank / micro-batch
      -> loop.train (PyTorch): GPT, loss.py (cross-entropy where a target is: through the logits,
         cross_entropy.py, or without them for a frozen head, frozen_head.py) -> AdamW (decoupled decay)
         + nn.schedule.lr_at + clipping, gradient accumulation, bf16/fp16 autocast (precision.py),
         torch.compile, DDP (distributed.py), freed memory kept for the next step (allocator.py),
         checkpoints last.pt / best.pt with RNG + data position (checkpoint.py) -> bit-exact resume
      -> numpy_loop.train_numpy: the same steps on tinystack.nn's NumPy GPT (hand-written backward)
      -> a JSONL training log, a PNG loss curve (plot.py), a progress bar with loss, tokens/s and ETA
      -> checkpoint.save_model_dir: config.json + model.safetensors + tokenizer.json + tinystack.json

Fine-tuning (`tinystack finetune`, finetune.py) runs the same loop (loop.train_model) on a pretrained
model directory: conversations JSONL -> finetune_data (validate, quarantine, dedup, split by source)
-> finetune_batches (chat-template tokens, loss on assistant tokens only, padded batches) ->
all weights, or LoRA adapters (lora.py; on AMX CPUs their product fused, lora_amx.py) merged on save -> an
ordinary model directory + a held-out base-vs-fine-tuned comparison. Its linear layers run their products as
matmul_plan.py measured fastest for each shape on this machine (planned_linear.py; linear_ops.cpp).
"""
from tinystack.lazy import lazy_exports

_EXPORTS = {
    "BatchSampler": "tinystack.train.batches",
    "get_batch": "tinystack.train.batches",
    "load_checkpoint": "tinystack.train.checkpoint",
    "save_checkpoint": "tinystack.train.checkpoint",
    "save_model_dir": "tinystack.train.checkpoint",
    "NonFiniteLossError": "tinystack.train.loop",
    "TrainResult": "tinystack.train.loop",
    "finetune": "tinystack.train.finetune",
    "inject_lora": "tinystack.train.lora",
    "merge_lora": "tinystack.train.lora",
    "train_model": "tinystack.train.loop",
    "make_optimizer": "tinystack.train.optimizer",
    "train": "tinystack.train.loop",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["BatchSampler", "NonFiniteLossError", "TrainResult", "finetune",
           "get_batch", "inject_lora", "load_checkpoint", "make_optimizer", "merge_lora", "save_checkpoint",
           "save_model_dir", "train", "train_model"]
