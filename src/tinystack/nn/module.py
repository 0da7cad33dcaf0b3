"""The module system: parameters and gradients in plain dicts, backward written by hand.

A `Module` owns two dicts with the same keys, `params` and `grads` (local names such
as "weight", "bias"), and any number of child modules held as attributes. Names are
built like PyTorch's: a child stored as `self.c_fc` contributes `c_fc.weight`, a
`ModuleList` contributes `h.0.ln_1.weight`, ... so a NumPy model whose attributes
mirror the PyTorch GPT has exactly the PyTorch parameter names, and a torch
`state_dict()` loads with `load_state_dict` once converted to NumPy.

Contract every layer follows:
  * `forward(x)` computes the output and caches what backward needs (the last call only).
  * `backward(dout)` takes dL/d(output) of the same shape as the output, ADDS dL/dparam
    into `self.grads` (in place: gradients accumulate until `zero_grad()`, like torch),
    and returns dL/d(input).
  * Arrays in `params`/`grads` are never replaced, only written in place, so an
    optimiser holding references to them stays valid, and two modules that share one
    array (weight tying) both accumulate into the same gradient.
"""
from __future__ import annotations

from typing import Any, Iterator, Mapping

import numpy as np


class Module:
    """Base class. Subclasses call `super().__init__()` then `self.add_param(...)`."""

    def __init__(self) -> None:
        self.params: dict[str, np.ndarray] = {}
        self.grads: dict[str, np.ndarray] = {}
        self.training: bool = True

    def add_param(self, name: str, value: np.ndarray) -> np.ndarray:
        """Register a parameter and its zero gradient (same shape and dtype); returns the parameter."""
        if "." in name:
            raise ValueError(f"parameter name {name!r} must not contain '.' (dots separate modules)")
        self.params[name] = value
        self.grads[name] = np.zeros_like(value)
        return value

    # -- the two methods every layer implements ---------------------------------------
    def forward(self, x: Any) -> np.ndarray:
        raise NotImplementedError

    def backward(self, dout: np.ndarray) -> np.ndarray | None:
        """dL/d(output) -> dL/d(input); None only where the input is not differentiable (token ids)."""
        raise NotImplementedError

    def __call__(self, x: Any) -> np.ndarray:
        return self.forward(x)

    # -- the tree ----------------------------------------------------------------------
    def named_children(self) -> Iterator[tuple[str, Module]]:
        """Child modules in attribute-assignment order (Python dicts keep insertion order)."""
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """This module (named `prefix`) and every descendant, depth first."""
        yield prefix, self
        for name, child in self.named_children():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def _named(self, which: str, remove_duplicate: bool) -> Iterator[tuple[str, np.ndarray]]:
        seen: set[int] = set()
        for mod_name, mod in self.named_modules():
            for local, p in mod.params.items():
                # dedup by the parameter array (tied weights are one parameter, listed under
                # its first name, exactly like torch's named_parameters)
                if remove_duplicate:
                    if id(p) in seen:
                        continue
                    seen.add(id(p))
                arr = p if which == "params" else mod.grads[local]
                yield (f"{mod_name}.{local}" if mod_name else local), arr

    def named_parameters(self, remove_duplicate: bool = True) -> Iterator[tuple[str, np.ndarray]]:
        """(dotted name, parameter array) for the whole tree, e.g. ('h.0.ln_1.weight', array)."""
        return self._named("params", remove_duplicate)

    def named_grads(self, remove_duplicate: bool = True) -> Iterator[tuple[str, np.ndarray]]:
        """Same names and order as `named_parameters`, yielding the gradient arrays."""
        return self._named("grads", remove_duplicate)

    def parameters(self) -> dict[str, np.ndarray]:
        """{dotted name: parameter array} (references, not copies) - what optimisers take."""
        return dict(self.named_parameters())

    def gradients(self) -> dict[str, np.ndarray]:
        """{dotted name: gradient array} (references), same keys as `parameters()`."""
        return dict(self.named_grads())

    def num_params(self) -> int:
        return sum(p.size for _, p in self.named_parameters())

    # -- state -------------------------------------------------------------------------
    def zero_grad(self) -> None:
        """Set every gradient to 0 in place (the arrays stay the same objects)."""
        for _, g in self.named_grads():
            g.fill(0)

    def train(self, mode: bool = True) -> Module:
        """Set the training flag on the whole tree (only Dropout reads it); returns self."""
        for _, m in self.named_modules():
            m.training = mode
        return self

    def eval(self) -> Module:
        return self.train(False)

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of all parameters under every name, tied aliases included (like torch)."""
        return {n: p.copy() for n, p in self.named_parameters(remove_duplicate=False)}

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> None:
        """Copy values into the existing arrays (in place, cast to their dtype).

        Values may be NumPy arrays or anything `np.asarray` accepts (e.g. CPU torch
        tensors). With strict=True, missing or unexpected names raise KeyError; a shape
        mismatch always raises ValueError.
        """
        own = dict(self.named_parameters(remove_duplicate=False))
        if strict:
            missing, unexpected = sorted(own.keys() - state.keys()), sorted(state.keys() - own.keys())
            if missing or unexpected:
                raise KeyError(f"load_state_dict: missing {missing}, unexpected {unexpected}")
        for name, value in state.items():
            if name not in own:
                continue
            arr = np.asarray(value)
            if arr.shape != own[name].shape:
                raise ValueError(f"load_state_dict: {name} has shape {arr.shape}, expected {own[name].shape}")
            own[name][...] = arr

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        children = [f"  ({n}): " + repr(c).replace("\n", "\n  ") for n, c in self.named_children()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        return head + ("\n" + "\n".join(children) + "\n)" if children else ")")


class ModuleList(Module):
    """An indexable list of modules named "0", "1", ... (GPT's `transformer.h`). No forward."""

    def __init__(self, modules: list[Module] | tuple[Module, ...] = ()) -> None:
        super().__init__()
        self.items: list[Module] = list(modules)

    def named_children(self) -> Iterator[tuple[str, Module]]:
        for i, m in enumerate(self.items):
            yield str(i), m

    def append(self, module: Module) -> None:
        self.items.append(module)

    def __getitem__(self, i: int) -> Module:
        return self.items[i]

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Module]:
        return iter(self.items)


class Sequential(ModuleList):
    """Modules applied in order; backward runs them in reverse (the chain rule, one link each)."""

    def __init__(self, *modules: Module) -> None:
        super().__init__(modules)

    def forward(self, x: Any) -> np.ndarray:
        for m in self.items:
            x = m.forward(x)
        return x

    def backward(self, dout: np.ndarray) -> np.ndarray | None:
        for i, m in enumerate(reversed(self.items)):
            d = m.backward(dout)
            if d is None and i < len(self.items) - 1:
                raise RuntimeError(f"{type(m).__name__} returned no input gradient but is not the first module")
            dout = d  # type: ignore[assignment]
        return dout
