"""A draft model for speculative decoding (speculative.py): a smaller model with the target's tokenizer.

It keeps its own paged KV cache (its own KVStorage, BlockManager without prefix caching, ModelRunner)
and one shadow Sequence per target sequence:

    propose(rows):  shadow.token_ids := the target's tokens; the shadow's cache keeps the longest prefix
                    it shares with them (tokens rejected last step are dropped, blocks past it freed)
                    k times, all rows in one batched draft forward: feed what the shadow has not computed
                    (the first round: the catch-up, e.g. the whole prompt once), take the next token
                    (argmax for greedy rows, else a draw from q = sampling_probs with the row's params and
                    generator, q kept for the rejection rule) and append it to the shadow
Shadows of finished sequences are dropped at the next call. The draft's cache has as many token slots
as the target's; a row that finds no room drafts fewer tokens (never a wrong one).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from tinystack.infer.block_manager import BlockManager
from tinystack.infer.loading import load_for_inference
from tinystack.infer.model_runner import ModelRunner
from tinystack.infer.paged_cache import KVStorage
from tinystack.infer.sampler import is_greedy, sampling_probs
from tinystack.infer.sequence import Sequence
from tinystack.tokenizer import load_tokenizer


@dataclass
class Draft:
    """Proposed tokens for one row; `q` [d, V] is the draft model's distribution for each (sampled rows
    of a draft model), None for a point mass (prompt lookup, or greedy)."""

    tokens: list[int]
    q: torch.Tensor | None = None


BLOCK_SIZE = 16
_PROBE = "Speculative decoding checks drafts: def f(x):\n    return x * 2  # ünïcödé 123"


def same_tokenizer(a, b) -> bool:
    """Do two tokenizers turn text into the same ids and back (and stop on the same EOS)?"""
    ids = a.encode_ordinary(_PROBE)
    return (ids == b.encode_ordinary(_PROBE) and a.decode(ids) == b.decode(ids)
            and a.eos_token_id == b.eos_token_id)


def load_draft(draft_model: str | Path | torch.nn.Module, target: torch.nn.Module, tokenizer, device: torch.device,
               draft_tokenizer=None) -> torch.nn.Module:
    """The draft model (a directory is loaded with dtype "auto"), refused in one line unless its tokenizer
    (checked before any weight is loaded) and vocabulary are the target's."""
    name = str(draft_model) if isinstance(draft_model, (str, Path)) else type(draft_model).__name__
    if isinstance(draft_model, (str, Path)):
        if not Path(draft_model).is_dir():
            raise ValueError(f"draft_model {name}: not a model directory")
        draft_tokenizer = load_tokenizer(draft_model)
    if draft_tokenizer is not None and not same_tokenizer(draft_tokenizer, tokenizer):
        raise ValueError(f"draft model {name}: its tokenizer is not the target's "
                         "(speculative decoding needs the same tokenizer)")
    if isinstance(draft_model, (str, Path)):
        draft_model, _ = load_for_inference(draft_model, device=str(device), tokenizer=draft_tokenizer)  # auto
    if draft_model.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"draft model {name} has a vocabulary of {draft_model.config.vocab_size} tokens, "
                         f"the target {target.config.vocab_size}: speculative decoding needs the same tokenizer")
    return draft_model.eval()


class DraftModel:
    """Proposer for speculative.Speculator: up to k tokens per row from a small model, batched over rows."""

    def __init__(self, model: torch.nn.Module, k: int, num_token_slots: int, device: torch.device,
                 hugepages: bool):
        cfg = model.config
        param = next(model.parameters())
        dtype = param.dtype if param.is_floating_point() else torch.float32
        num_blocks = -(-num_token_slots // BLOCK_SIZE)
        self.storage = KVStorage(cfg.n_layer, num_blocks, BLOCK_SIZE, cfg.n_kv_head, cfg.head_dim, dtype, device,
                                 hugepages)
        self.bm = BlockManager(num_blocks, BLOCK_SIZE, enable_prefix_caching=False)
        self.runner = ModelRunner(model, self.storage, device, hugepages)
        self.k, self.max_seq_len = k, cfg.max_seq_len
        self.shadows: dict[Sequence, Sequence] = {}

    def describe(self) -> str:
        """One line for the engine's start-up report (LLMEngine.describe)."""
        return (f"draft model: {self.runner.model.config.n_layer} layers, KV cache "
                f"{self.storage.nbytes / 2**20:.1f} MiB ({self.bm.num_blocks} blocks of {BLOCK_SIZE} tokens, "
                f"outside the memory budget)")

    def _sync(self, seq: Sequence) -> Sequence:
        shadow = self.shadows.get(seq)
        if shadow is None:
            shadow = self.shadows[seq] = Sequence(seq.request_id, "", [], seq.params, seq.max_new_tokens)
        common = 0
        for a, b in zip(shadow.token_ids[:shadow.num_computed], seq.token_ids):
            if a != b:
                break
            common += 1
        shadow.num_computed = common
        shadow.token_ids = list(seq.token_ids)
        if shadow.block_table:
            self.bm.truncate(shadow)
        return shadow

    @torch.inference_mode()
    def propose(self, rows: list[tuple[Sequence, int]]) -> list[Draft]:
        for seq in [s for s in self.shadows if s.is_finished]:
            self.bm.release(self.shadows.pop(seq))
        shadows = [self._sync(seq) for seq, _ in rows]
        tokens: list[list[int]] = [[] for _ in rows]
        qs: list[list[torch.Tensor]] = [[] for _ in rows]
        for _ in range(max(limit for _, limit in rows)):
            live = [r for r, (seq, limit) in enumerate(rows) if len(tokens[r]) < limit
                    and shadows[r].num_tokens < self.max_seq_len]
            batch = []
            for r in live:
                n = shadows[r].num_tokens - shadows[r].num_computed
                if self.bm.can_grow(shadows[r], n):
                    self.bm.grow(shadows[r], n)
                    batch.append((r, n))
            if not batch:
                break
            logits = self.runner.run([(shadows[r], n) for r, n in batch]).float()
            for (r, n), row in zip(batch, logits):
                seq, shadow = rows[r][0], shadows[r]
                shadow.num_computed += n
                if is_greedy(seq.params):
                    tok = int(row.argmax())
                else:
                    q = sampling_probs(row[None], seq.params)[0]
                    tok = int(torch.multinomial(q, 1, generator=seq.generator))
                    qs[r].append(q)
                shadow.token_ids.append(tok)
                tokens[r].append(tok)
            # rows that found no blocks stop drafting: their lists simply stay shorter
            for r in set(live) - {r for r, _ in batch}:
                rows[r] = (rows[r][0], len(tokens[r]))
        return [Draft(t, torch.stack(q) if q else None) for t, q in zip(tokens, qs)]
