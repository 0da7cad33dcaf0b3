"""Training: token files in, a model directory out.

    tokenizer/shards.py wrote train.bin / val.bin
      -> loop.train: random windows -> GPT -> AdamW + warmup/cosine (nn.schedule.lr_at) + grad clipping,
         periodic val loss, a JSONL training log, a progress bar with loss and tokens/s
      -> checkpoint.save_model_dir: config.json + model.safetensors + tokenizer.json + tinystack.json
"""
from tinystack.train.checkpoint import save_model_dir
from tinystack.train.loop import NonFiniteLossError, TrainResult, estimate_loss, get_batch, make_optimizer, train

__all__ = ["NonFiniteLossError", "TrainResult", "estimate_loss", "get_batch", "make_optimizer",
           "save_model_dir", "train"]
