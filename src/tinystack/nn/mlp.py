"""An MLP classifier: the smallest complete model built from the layers, trained end to end.

    x [N, d_in] -> Linear -> act -> [Dropout] -> ... -> Linear -> logits [N, n_classes]

It is a `Sequential`, so its parameter names are those of the equivalent
`torch.nn.Sequential` ("0.weight", "0.bias", "2.weight", ...).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from numpy.typing import DTypeLike

from tinystack.nn.layers import GELU, Dropout, Linear, ReLU
from tinystack.nn.loss import softmax_cross_entropy
from tinystack.nn.module import Module, Sequential


class MLP(Sequential):
    """sizes = [d_in, hidden..., n_classes]; one activation (and Dropout if dropout > 0) after
    every Linear except the last. Weights are drawn from one Generator seeded with `seed`.
    """

    def __init__(
        self,
        sizes: Sequence[int],
        activation: str = "relu",
        dropout: float = 0.0,
        *,
        dtype: DTypeLike = np.float32,
        seed: int = 0,
    ) -> None:
        if len(sizes) < 2:
            raise ValueError(f"sizes needs at least [d_in, n_classes], got {list(sizes)}")
        acts = {"relu": ReLU, "gelu": GELU}
        if activation not in acts:
            raise ValueError(f"activation must be one of {sorted(acts)}, got {activation!r}")
        rng = np.random.default_rng(seed)
        layers: list[Module] = []
        for i, (d_in, d_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(Linear(d_in, d_out, dtype=dtype, rng=rng))
            if i < len(sizes) - 2:
                layers.append(acts[activation]())
                if dropout > 0:
                    layers.append(Dropout(dropout, seed=seed + 1 + i))
        super().__init__(*layers)

    def loss_and_grads(self, x: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
        """x [N, d_in], y [N] class ids -> (mean cross-entropy, {name: dL/dparam}).

        Zeroes the gradients first, so the returned arrays hold exactly this batch's
        gradients; they are the module's own gradient arrays (the ones an optimiser built
        from `gradients()` reads), not copies.
        """
        self.zero_grad()
        logits = self.forward(x)
        loss, dlogits = softmax_cross_entropy(logits, y)
        self.backward(dlogits)
        return loss, self.gradients()

    def predict(self, x: np.ndarray) -> np.ndarray:
        """x [N, d_in] -> predicted class ids [N] (argmax of the logits), dropout off."""
        was_training = self.training
        self.eval()
        try:
            return self.forward(x).argmax(axis=-1)
        finally:
            self.train(was_training)
