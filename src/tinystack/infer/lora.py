"""Many LoRA adapters over one base model, chosen per sequence and mixed in one batch (Punica's idea, hand-built).

An adapter changes a projection W to W + s B A (A [r, in], B [out, r], s = alpha / r). Merging it would need one
copy of the model per adapter; here the base weights stay shared and each step adds every row's own delta:

    y = x W^T                                         the base product, for all rows of the step at once
    y[rows of adapter a] += (x[rows] A_a^T) (s B_a)^T  for each adapter a present in the step: rows grouped by
                                                      adapter and padded into one batch [adapters, rows, in],
                                                      batched products per projection (Punica's SGMV); groups too
                                                      uneven to pad (a long prefill beside decodes): per group

That is the model's forward (LoRAProjection, below), which runs the long steps (prefills); the short ones (every
decode) do the same per token inside the fused C++ step from the same stacks (infer/fused_step.py, take_loras).

so a batch holding rows of several adapters (and of the base) is one base product plus small ones, and an
adapter's memory is its own A and B only (kept in the compute dtype). A fused projection (q/k/v -> qkv_proj,
gate/up -> gate_up_proj: model/fused_linear.py) keeps one adapter per original projection: its A stacks the
parts' A [P r, in] (one product for all parts) and its s B^T [r, out] the parts' B, each part's columns
multiplying its own r columns of x A^T.

    LoRAAdapter                 an adapter's weights, in PEFT's layout on disk (model/lora_adapter.py)
    AdapterSet(model, max_loras, max_lora_rank)
        .add(name, adapter)     checked against the model (every module exists, shapes fit, rank <= max_lora_rank,
                                at most max_loras resident): a ValueError naming what differs; returns its key
        .remove(name)           (the engine refuses while a sequence uses it)
        .replace(name, adapter) a new version under the same name: new sequences get it (a new key), the old key
                                stays resident in `retired` until its last sequence ends (the engine drops it)
        .rows(slots)            context manager for one step: slots[t] = the adapter key of packed token t (0: base)

Each adapter gets a key never used before (1, 2, ...): the prefix cache salts its block hashes with it, so two
adapters never share cached keys and values, and an adapter loaded again under the same name starts afresh.
"""
from __future__ import annotations

import itertools
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
    for K present adapters of at most M rows each, so each projection adds every delta in a few batched products."""

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
    `parts`: (original name, output size) of each projection fused in it, in output order. An adapter's weights
    here: A [P w, in] (part i's A in rows i w.., zeros where the adapter leaves a part out or its rank is under w)
    and s B^T [w, out] (each part's own columns): y[part i] += (x A[i w:(i + 1) w]^T) (s B^T)[:, part i]."""

    def __init__(self, base: nn.Module, parts: list[tuple[str, int]], owner: AdapterSet) -> None:
        super().__init__()
        self.base, self.parts, self.owner = base, parts, owner
        ends = list(itertools.accumulate(size for _, size in parts))
        self.bounds = list(zip([0, *ends[:-1]], ends))  # each part's output rows
        self.deltas: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # key -> (A [P w, in], s B^T [w, out])
        self.ranks: dict[int, int] = {}  # key -> the adapter's rank
        self.stack: tuple[torch.Tensor, torch.Tensor] | None = None  # every resident adapter's, padded (restack)

    def restack(self, keys: list[int]) -> None:
        """Stack the resident adapters `keys` (the set's order): A [K, P W, in], s B^T [K, W, out], W the widest rank
        (an adapter that does not adapt this projection: zeros). Each adapter's own (A, s B) then become views into
        the stack, so its weights are held once."""
        out, in_f, n_parts = self.bounds[-1][1], _in_features(self.base), len(self.parts)
        width = max(self.ranks.values(), default=1)
        a = torch.zeros(len(keys), n_parts * width, in_f, dtype=self.owner.dtype, device=self.owner.device)
        sbt = torch.zeros(len(keys), width, out, dtype=self.owner.dtype, device=self.owner.device)
        for k, key in enumerate(keys):
            if key in self.deltas:
                da, dsbt = self.deltas[key]
                r, w = self.ranks[key], dsbt.shape[0]
                for i in range(n_parts):
                    a[k, i * width:i * width + r] = da[i * w:i * w + r]
                sbt[k, :r] = dsbt[:r]
                self.deltas[key] = (a[k], sbt[k])
        self.stack = (a, sbt) if self.deltas else None

    def _delta(self, ax: torch.Tensor, sbt: torch.Tensor) -> torch.Tensor:
        """ax [..., P w] (x A^T), s B^T [..., w, out] -> the delta [..., out], part by part."""
        w = sbt.shape[-2]
        return torch.cat([ax[..., i * w:(i + 1) * w] @ sbt[..., lo:hi] for i, (lo, hi) in enumerate(self.bounds)],
                         dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        step = self.owner.step
        if step is None or not self.deltas:
            return y
        flat_x, flat_y = x.reshape(-1, x.shape[-1]), y.view(-1, y.shape[-1])
        if step.gather is not None:  # every adapter's rows at once: batched products, whatever their number
            a, sb = self.stack
            if not step.all_resident:
                a, sb = a.index_select(0, step.positions), sb.index_select(0, step.positions)
            xs = torch.cat([flat_x, flat_x.new_zeros(1, flat_x.shape[1])])[step.gather].to(a.dtype)  # [K, M, in]
            delta = self._delta(torch.bmm(xs, a.transpose(1, 2)), sb)  # [K, M, out]
            flat_y.index_add_(0, step.scatter, delta.reshape(-1, flat_y.shape[1]).to(y.dtype))
            return y
        for key, idx in step.groups:  # one adapter, or groups too uneven to pad: each group's own products
            delta = self.deltas.get(key)
            if delta is not None:
                a, sb = delta
                flat_y.index_add_(0, idx, self._delta(flat_x.index_select(0, idx).to(a.dtype) @ a.T, sb).to(y.dtype))
        return y


class AdapterSet:
    """The adapters resident on one model, and the step's rows (see the module doc)."""

    def __init__(self, model: nn.Module, max_loras: int, max_lora_rank: int) -> None:
        self.model, self.max_loras, self.max_lora_rank = model, max_loras, max_lora_rank
        self.keys: dict[str, int] = {}  # adapter name -> key
        self.resident: list[int] = []  # the keys, in load order: the projections' stacks follow it
        self.retired: set[int] = set()  # keys replaced under their name, resident while sequences still use them
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
            wrapper.ranks[key] = adapter.rank
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
        """(A [P r, in]: part i's in rows i r.., s B^T [r, out]: each part's own columns) in the compute dtype."""
        r, in_f = adapter.rank, _in_features(wrapper.base)
        a = torch.zeros(len(wrapper.parts) * r, in_f, device=self.device, dtype=self.dtype)
        sbt = torch.zeros(r, wrapper.bounds[-1][1], device=self.device, dtype=self.dtype)
        for i, (pa, pb) in parts.items():
            lo, hi = wrapper.bounds[i]
            a[i * r:(i + 1) * r] = pa
            sbt[:, lo:hi] = adapter.scale * pb.T.to(self.device, self.dtype)
        return a, sbt

    def replace(self, name: str, adapter: LoRAAdapter) -> int:
        """`adapter` under `name` for new sequences (checked as add checks it); the old version's key retired."""
        old = self.keys.pop(name)
        try:
            key = self.add(name, adapter)
        except ValueError:
            self.keys[name] = old
            raise
        self.retired.add(old)
        return key

    def remove(self, name: str) -> None:
        key = self.keys.pop(name, None)
        if key is None:
            raise KeyError(name)
        self.drop(key)

    def drop(self, key: int) -> None:
        """Free a key's weights (one no name maps to any more: removed, or retired and unused)."""
        self.retired.discard(key)
        for wrapper, *_ in self.projections.values():
            wrapper.deltas.pop(key, None)
            wrapper.ranks.pop(key, None)
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
