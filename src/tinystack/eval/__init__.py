"""Evaluation: a model directory and token files in, metrics out (eval.json).

    model_dir + {val,test}.bin -> fixed non-overlapping windows -> summed next-token NLL
      -> loss, perplexity, bits per byte per split (metrics.py)
"""
from tinystack.eval.metrics import evaluate_tokens, window_starts

__all__ = ["evaluate_tokens", "window_starts"]
