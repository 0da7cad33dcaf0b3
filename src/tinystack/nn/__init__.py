"""The NumPy backend: neural-network layers whose backward passes are written by hand.

It exists to learn from: nothing here uses autograd, every gradient is derived and
coded explicitly, and the tests check each one against central finite differences
and against PyTorch autograd on identical weights (float64).

How data flows (one training step):

    model.zero_grad()                          grads <- 0 (in place)
    logits = model.forward(x)                  each module caches what its backward needs
    loss, dlogits = softmax_cross_entropy(logits, y)
    model.backward(dlogits)                    reverse order; each module ADDS into .grads
    clip_grad_norm(model.gradients(), 1.0)     optional, global L2 norm
    opt.step(lr_at(it, ...))                   optimiser updates the parameter arrays in place

A `Module` keeps `params` and `grads` dicts (same keys) and child modules as attributes;
`named_parameters()` joins them into dotted names (`h.0.ln_1.weight`) chosen to equal
the PyTorch GPT's (`tinystack.model.gpt`), so weights move between the two backends by
name. Files: module.py (Module, ModuleList, Sequential), layers.py, attention.py (causal
multi-head self-attention), loss.py, mlp.py, optim.py, schedule.py (the project's single LR
schedule), gradcheck.py; datasets.py (sklearn digits, MNIST IDX) and classify.py (MLP training);
gpt.py (the NumPy GPT) and gpt_io.py (to/from the PyTorch GPT and the model directory) import
torch for the shared GPTConfig, so they are imported from their modules, not from here; so is nll.py
(token_nll, the torch next-token loss that evaluation's scores and inference's perplexities both sum).
"""
from tinystack.nn.attention import CausalSelfAttention
from tinystack.nn.gradcheck import numerical_grad, rel_error
from tinystack.nn.layers import GELU, Dropout, Embedding, LayerNorm, Linear, ReLU
from tinystack.nn.loss import softmax_cross_entropy
from tinystack.nn.mlp import MLP
from tinystack.nn.module import Module, ModuleList, Sequential
from tinystack.nn.optim import SGD, Adam, AdamW, Optimizer, clip_grad_norm, default_no_decay
from tinystack.nn.schedule import lr_at

__all__ = [
    "Module",
    "ModuleList",
    "Sequential",
    "Linear",
    "ReLU",
    "GELU",
    "LayerNorm",
    "Embedding",
    "Dropout",
    "CausalSelfAttention",
    "softmax_cross_entropy",
    "MLP",
    "Optimizer",
    "SGD",
    "Adam",
    "AdamW",
    "clip_grad_norm",
    "default_no_decay",
    "lr_at",
    "numerical_grad",
    "rel_error",
]
