"""The layers: Linear, ReLU, GELU, LayerNorm, Embedding, Dropout - forward and backward by hand.

Shapes use `...` for any leading dims ([N, C] for an MLP, [B, T, C] for a transformer);
every layer acts on the last dim only. Parameters are created in the `dtype` given to
the constructor (float32 to train, float64 for gradient checks); parameter-free
layers compute in the input's dtype. Each backward line carries its derivation.
"""
from __future__ import annotations

import math

import numpy as np
from numpy.typing import DTypeLike

from tinystack.nn.module import Module


class Linear(Module):
    """y = x @ W.T + b.   x [..., in] -> y [..., out];  weight [out, in], bias [out] (as torch.nn.Linear).

    Init as torch.nn.Linear: W, b ~ U(-1/sqrt(in), 1/sqrt(in)), drawn from `rng`
    (default: a Generator seeded with 0, so a layer is reproducible on its own).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        dtype: DTypeLike = np.float32,
        rng: np.random.Generator | None = None,
    ) -> None:
        super().__init__()
        rng = rng if rng is not None else np.random.default_rng(0)
        bound = 1.0 / math.sqrt(in_features)
        self.in_features, self.out_features = in_features, out_features
        self.add_param("weight", rng.uniform(-bound, bound, (out_features, in_features)).astype(dtype))
        if bias:
            self.add_param("bias", rng.uniform(-bound, bound, (out_features,)).astype(dtype))
        self._x: np.ndarray | None = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        self._x = x
        y = x @ self.params["weight"].T
        if "bias" in self.params:
            y = y + self.params["bias"]
        return y

    def backward(self, dout: np.ndarray) -> np.ndarray:
        assert self._x is not None, "backward before forward"
        x2 = self._x.reshape(-1, self.in_features)  # fold leading dims: every row is one example
        d2 = dout.reshape(-1, self.out_features)
        self.grads["weight"] += d2.T @ x2  # y_ro = sum_i W_oi x_ri  ->  dW_oi = sum_r dy_ro x_ri
        if "bias" in self.params:
            self.grads["bias"] += d2.sum(axis=0)  # b is broadcast over rows -> its grad sums over rows
        return dout @ self.params["weight"]  # dx_ri = sum_o dy_ro W_oi

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, bias={'bias' in self.params}"


class ReLU(Module):
    """y = max(x, 0), elementwise, any shape."""

    def forward(self, x: np.ndarray) -> np.ndarray:
        self._mask = x > 0
        return np.where(self._mask, x, 0).astype(x.dtype, copy=False)

    def backward(self, dout: np.ndarray) -> np.ndarray:
        return dout * self._mask  # slope 1 where x > 0, else 0 (at exactly 0 we pick 0, like torch)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


class GELU(Module):
    """GPT-2's GELU, tanh approximation (`F.gelu(x, approximate="tanh")`), elementwise, any shape.

    y = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
    """

    def forward(self, x: np.ndarray) -> np.ndarray:
        self._x = x
        self._t = np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * (x * x * x)))  # x*x*x: np.power(x, 3) is far slower
        return 0.5 * x * (1.0 + self._t)

    def backward(self, dout: np.ndarray) -> np.ndarray:
        x, t = self._x, self._t
        # product rule: dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) du/dx,  du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
        du = _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * (x * x))
        return dout * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)


class LayerNorm(Module):
    """Normalise the last dim to mean 0 / variance 1, then scale and shift.

    x [..., C] -> y [..., C];  y = (x - mean) / sqrt(var + eps) * weight + bias,
    var is the biased (1/C) variance, as in torch. weight starts at 1, bias at 0.
    """

    def __init__(self, n: int, eps: float = 1e-5, *, dtype: DTypeLike = np.float32) -> None:
        super().__init__()
        self.n, self.eps = n, eps
        self.add_param("weight", np.ones(n, dtype=dtype))
        self.add_param("bias", np.zeros(n, dtype=dtype))

    def forward(self, x: np.ndarray) -> np.ndarray:
        mean = x.mean(axis=-1, keepdims=True)
        xc = x - mean
        var = (xc * xc).mean(axis=-1, keepdims=True)
        self._rstd = 1.0 / np.sqrt(var + self.eps)
        self._xhat = xc * self._rstd
        return self._xhat * self.params["weight"] + self.params["bias"]

    def backward(self, dout: np.ndarray) -> np.ndarray:
        xhat, rstd = self._xhat, self._rstd
        lead = tuple(range(dout.ndim - 1))  # weight/bias are broadcast over all leading dims
        self.grads["weight"] += (dout * xhat).sum(axis=lead)  # y = xhat * w + b
        self.grads["bias"] += dout.sum(axis=lead)
        dxhat = dout * self.params["weight"]
        # xhat = (x - mean) * rstd depends on x directly, via the mean and via the variance;
        # summing the three paths gives  dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
        return rstd * (
            dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True)
        )

    def extra_repr(self) -> str:
        return f"{self.n}, eps={self.eps}"


class Embedding(Module):
    """Row lookup.  idx [...] (ints in [0, num)) -> weight[idx] [..., dim];  weight [num, dim] ~ N(0, 1) as torch."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        dtype: DTypeLike = np.float32,
        rng: np.random.Generator | None = None,
    ) -> None:
        super().__init__()
        rng = rng if rng is not None else np.random.default_rng(0)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.add_param("weight", rng.standard_normal((num_embeddings, embedding_dim)).astype(dtype))

    def forward(self, idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx)
        if not np.issubdtype(idx.dtype, np.integer):
            raise TypeError(f"Embedding expects integer indices, got {idx.dtype}")
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_embeddings):
            raise IndexError(f"index out of range [0, {self.num_embeddings})")
        self._idx = idx
        return self.params["weight"][idx]

    def backward(self, dout: np.ndarray) -> None:
        # each output row is a copy of weight[idx]: its gradient flows back to that row; a token
        # seen k times gets k contributions, which `W[idx] += d` would silently drop (np.add.at does not)
        np.add.at(self.grads["weight"], self._idx.reshape(-1), dout.reshape(-1, self.embedding_dim))
        return None  # integer indices have no gradient

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class Dropout(Module):
    """Inverted dropout, any shape: in training zero each element with probability p and scale the
    survivors by 1/(1-p) (so the expected output equals the input and eval needs no rescale);
    identity in eval mode or when p == 0. Masks come from a Generator seeded with `seed`.
    """

    def __init__(self, p: float = 0.0, *, seed: int = 0) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout p must be in [0, 1), got {p}")
        self.p = p
        self.rng = np.random.default_rng(seed)
        self._mask: np.ndarray | None = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        if not self.training or self.p == 0.0:
            self._mask = None
            return x
        keep = self.rng.random(x.shape) >= self.p
        self._mask = keep.astype(x.dtype) / x.dtype.type(1.0 - self.p)
        return x * self._mask

    def backward(self, dout: np.ndarray) -> np.ndarray:
        # y = x * mask (mask fixed in forward) -> dx = dout * mask; identity when no mask was drawn
        return dout if self._mask is None else dout * self._mask

    def extra_repr(self) -> str:
        return f"p={self.p}"
