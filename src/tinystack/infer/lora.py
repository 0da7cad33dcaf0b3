"""Many LoRA adapters over one base model, chosen per sequence and mixed in one batch (Punica's idea, hand-built).

An adapter changes a projection W to W + s B A (A [r, in], B [out, r], s = alpha / r). Merging it would need one
copy of the model per adapter; here the base weights stay shared and each step adds every row's own delta:

    y = x W^T                                         the base product, for all rows of the step at once
    y[rows of adapter a] += (x[rows] A_a^T) (s B_a)^T  for each adapter a present in the step: rows grouped by
                                                      adapter and padded into one batch [adapters, rows, in], two
                                                      batched products per projection (Punica's SGMV); groups too
                                                      uneven to pad (a long prefill beside decodes): per group

so a batch holding rows of several adapters (and of the base) is one base product plus small ones, and an
adapter's memory is its own A and B only (kept in the compute dtype). A fused projection (q/k/v -> qkv_proj,
gate/up -> gate_up_proj: model/fused_linear.py) keeps one adapter per original projection: its A stacks the
parts' A [P r, in] and its B is block-diagonal [out, P r], one product for all parts.

    LoRAAdapter                 an adapter's weights, in PEFT's layout on disk (model/lora_adapter.py)
    AdapterSet(model, max_loras, max_lora_rank)
        .add(name, adapter)     checked against the model (every module exists, shapes fit, rank <= max_lora_rank,
                                at most max_loras resident): a ValueError naming what differs; returns its key
        .remove(name)           (the engine refuses while a sequence uses it)
        .rows(slots)            context manager for one step: slots[t] = the adapter key of packed token t (0: base)

Each adapter gets a key never used before (1, 2, ...): the prefix cache salts its block hashes with it, so two
adapters never share cached keys and values, and an adapter loaded again under the same name starts afresh.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from tinystack.model.lora_adapter import LoRAAdapter

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
               "c_attn", "c_proj", "c_fc")  # Llama family and GPT-2: what an adapter may target


class _Step:
    """One step's rows, grouped by adapter (the keys present, and the packed token indices of each), and, when the
    groups are about even, the same as one padded batch: gather [K, M] (row indices, T = a zero row for padding)
    for K present adapters of at most M rows each, so each projection adds every delta in two batched products."""

    def __init__(self, slots: Sequence[int], resident: list[int], device: torch.device) -> None:
        groups: dict[int, list[int]] = {}
        for t, key in enumerate(slots):
            if key:
                groups.setdefault(key, []).append(t)
        self.groups = [(key, torch.tensor(idx, dtype=torch.long, device=device)) for key, idx in groups.items()]
        self.gather: torch.Tensor | None = None
        widest, rows = max(len(v) for v in groups.values()), sum(len(v) for v in groups.values())
        if len(groups) > 1 and len(groups) * widest <= 2 * rows:  # padding at most doubles the small products
            t = len(slots)
            present = sorted(groups, key=resident.index)
            self.all_resident = len(present) == len(resident)
            self.positions = torch.tensor([resident.index(k) for k in present], device=device)  # into the stacks
            pad = [groups[k] + [t] * (widest - len(groups[k])) for k in present]
            self.gather = torch.tensor(pad, dtype=torch.long, device=device)
            self.scatter = torch.where(self.gather == t, 0, self.gather).reshape(-1)  # a pad adds zeros to row 0


class LoRAProjection(nn.Module):
    """A projection of the base model with the adapters' deltas for the step's rows added (see the module doc).
    `parts`: (original name, output size) of each projection fused in it, in output order."""

    def __init__(self, base: nn.Module, parts: list[tuple[str, int]], owner: AdapterSet) -> None:
        super().__init__()
        self.base, self.parts, self.owner = base, parts, owner
        self.deltas: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # key -> (A [P r, in], s B [out, P r])
        self.stack: tuple[torch.Tensor, torch.Tensor] | None = None  # every resident adapter's, padded (restack)

    def restack(self, keys: list[int]) -> None:
        """Stack the resident adapters `keys` (the set's order): A [K, R, in], s B [K, out, R], zero-padded to the
        widest R (an adapter that does not adapt this projection: zeros). Each adapter's own (A, s B) then become
        views into the stack, so its weights are held once."""
        out, in_f = sum(size for _, size in self.parts), _in_features(self.base)
        width = max([d[0].shape[0] for d in self.deltas.values()], default=1)
        a = torch.zeros(len(keys), width, in_f, dtype=self.owner.dtype, device=self.owner.device)
        sb = torch.zeros(len(keys), out, width, dtype=self.owner.dtype, device=self.owner.device)
        for k, key in enumerate(keys):
            if key in self.deltas:
                da, dsb = self.deltas[key]
                w = da.shape[0]
                a[k, :w], sb[k, :, :w] = da, dsb
                self.deltas[key] = (a[k, :w], sb[k, :, :w])
        self.stack = (a, sb) if self.deltas else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        step = self.owner.step
        if step is None or not self.deltas:
            return y
        flat_x, flat_y = x.reshape(-1, x.shape[-1]), y.view(-1, y.shape[-1])
        if step.gather is not None:  # every adapter's rows at once: two batched products, whatever their number
            a, sb = self.stack
            if not step.all_resident:
                a, sb = a.index_select(0, step.positions), sb.index_select(0, step.positions)
            xs = torch.cat([flat_x, flat_x.new_zeros(1, flat_x.shape[1])])[step.gather].to(a.dtype)  # [K, M, in]
            delta = torch.bmm(torch.bmm(xs, a.transpose(1, 2)), sb.transpose(1, 2))  # [K, M, out]
            flat_y.index_add_(0, step.scatter, delta.reshape(-1, flat_y.shape[1]).to(y.dtype))
            return y
        for key, idx in step.groups:  # one adapter, or groups too uneven to pad: each group's own products
            delta = self.deltas.get(key)
            if delta is not None:
                a, sb = delta
                flat_y.index_add_(0, idx, ((flat_x.index_select(0, idx).to(a.dtype) @ a.T) @ sb.T).to(y.dtype))
        return y


class AdapterSet:
    """The adapters resident on one model, and the step's rows (see the module doc)."""

    def __init__(self, model: nn.Module, max_loras: int, max_lora_rank: int) -> None:
        self.model, self.max_loras, self.max_lora_rank = model, max_loras, max_lora_rank
        self.keys: dict[str, int] = {}  # adapter name -> key
        self.resident: list[int] = []  # the keys, in load order: the projections' stacks follow it
        self.step: _Step | None = None
        self.version = 0  # bumped whenever the stacks change (the fused step re-reads them)
        self._next_key = 1
        self.dtype = next(model.parameters()).dtype if next(model.parameters()).is_floating_point() \
            else torch.float32
        self.device = next(model.parameters()).device
        self.projections = self._wrap(model)  # original module path -> (its LoRAProjection, offset, out, part)

    def _wrap(self, model: nn.Module) -> dict[str, tuple[LoRAProjection, int, int, int]]:
        where: dict[str, tuple[LoRAProjection, int, int, int]] = {}
        for path, parent in list(model.named_modules()):
            fused = getattr(parent, "fused_parts", {})
            names = [(n, [(n, 0)]) for n, _ in parent.named_children() if n in PROJECTIONS]
            names += [(f, list(zip(parts, sizes))) for f, (parts, sizes) in fused.items()]
            for name, parts in names:
                base = getattr(parent, name)
                if isinstance(base, LoRAProjection):
                    continue
                if len(parts) == 1:
                    parts = [(name, _out_features(base))]
                wrapper = LoRAProjection(base, parts, self)
                setattr(parent, name, wrapper)
                offset = 0
                for i, (part, size) in enumerate(parts):
                    where[f"{path}.{part}" if path else part] = (wrapper, offset, size, i)
                    offset += size
        return where

    def add(self, name: str, adapter: LoRAAdapter) -> int:
        if name in self.keys:
            raise ValueError(f"a LoRA adapter named {name!r} is already loaded")
        if len(self.keys) >= self.max_loras:
            raise ValueError(f"{len(self.keys)} LoRA adapters are loaded, max_loras is {self.max_loras}: unload one")
        if adapter.rank > self.max_lora_rank:
            raise ValueError(f"adapter {name!r} has rank {adapter.rank}; max_lora_rank is {self.max_lora_rank}")
        per_wrapper: dict[LoRAProjection, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
        for module, (a, b) in adapter.weights.items():
            hit = self.projections.get(module)
            if hit is None:
                raise ValueError(f"adapter {name!r} targets {module}, which this base model does not have "
                                 "(an adapter trained for another base?)")
            wrapper, _, size, part = hit
            in_features = _in_features(wrapper.base)
            if a.shape != (adapter.rank, in_features) or b.shape != (size, adapter.rank):
                raise ValueError(f"adapter {name!r}: {module} has A {tuple(a.shape)} and B {tuple(b.shape)}; this "
                                 f"base model needs A ({adapter.rank}, {in_features}) and B ({size}, {adapter.rank})")
            per_wrapper.setdefault(wrapper, {})[part] = (a, b)
        key, self._next_key = self._next_key, self._next_key + 1
        for wrapper, parts in per_wrapper.items():
            wrapper.deltas[key] = self._stack(wrapper, parts, adapter)
        self.keys[name] = key
        self.resident.append(key)
        self._restack()
        return key

    def _restack(self) -> None:
        for wrapper in {hit[0] for hit in self.projections.values()}:
            wrapper.restack(self.resident)
        self.version += 1

    def _stack(self, wrapper: LoRAProjection, parts: dict[int, tuple[torch.Tensor, torch.Tensor]],
               adapter: LoRAAdapter) -> tuple[torch.Tensor, torch.Tensor]:
        """(A of the parts stacked [P r, in], s B block-diagonal [out, P r]) in the compute dtype."""
        r, out = adapter.rank, sum(size for _, size in wrapper.parts)
        order = sorted(parts)
        a = torch.cat([parts[i][0] for i in order]).to(self.device, self.dtype)
        sb = torch.zeros(out, r * len(order), device=self.device, dtype=self.dtype)
        offsets = [sum(size for _, size in wrapper.parts[:i]) for i in range(len(wrapper.parts))]
        for j, i in enumerate(order):
            size = wrapper.parts[i][1]
            sb[offsets[i]:offsets[i] + size, j * r:(j + 1) * r] = adapter.scale * parts[i][1].to(self.device,
                                                                                                   self.dtype)
        return a.contiguous(), sb

    def remove(self, name: str) -> None:
        key = self.keys.pop(name, None)
        if key is None:
            raise KeyError(name)
        for wrapper, *_ in self.projections.values():
            wrapper.deltas.pop(key, None)
        self.resident.remove(key)
        self._restack()

    @contextmanager
    def rows(self, slots: Sequence[int]) -> Iterator[None]:
        self.step = _Step(slots, self.resident, self.device) if any(slots) else None
        try:
            yield
        finally:
            self.step = None


def _out_features(layer: nn.Module) -> int:
    return int(getattr(layer, "out_features", None) or layer.weight.shape[0])


def _in_features(layer: nn.Module) -> int:
    return int(getattr(layer, "in_features", None) or layer.weight.shape[1])
