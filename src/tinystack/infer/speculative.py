"""Speculative decoding: guess the next few tokens cheaply, check them all in one forward of the target model.

    step:  scheduler batch
       ->  Speculator.propose: each decode row that may speculate gets up to k draft tokens from the
           proposer (prompt lookup here, or a draft model: draft_model.py); its blocks grow for 1 + d tokens
       ->  ModelRunner.run(batch, drafts): the row feeds [last token, d_1..d_d] and gets the target's
           logits at all 1 + d positions (position i predicts what follows d_1..d_i)
       ->  Speculator.verify: the tokens to append = the accepted drafts + one token from the target
           (the correction at the first rejection, or a bonus token when all d are accepted)
       ->  the engine appends them one by one (EOS / stop strings / max_tokens checked per token), then
           Speculator.rollback: num_computed counts only the verified tokens and the blocks past them go
           back to the free list. The rejected tokens' keys/values stay in the slots past num_computed,
           which attention never reads (it reads 0..num_computed+n-1 and writes new keys before reading),
           and are overwritten when those positions are really computed.

Exactness. Greedy rows accept a draft while it equals the target's argmax, so the output is the
plain greedy output (up to float rounding in the wider forward). Sampled rows use the standard
rejection rule (Leviathan et al. 2023; Chen et al. 2023): draft d drawn from q is accepted with
probability min(1, p(d) / q(d)), else the token is drawn from norm(max(0, p - q)); p is the target's
distribution after temperature / top-k / top-p / min-p (sampler.sampling_probs). A prompt-lookup
draft is a point mass (q(d) = 1): accept with p(d), else draw from p with d removed.

Which rows speculate (the one rule): a row that decodes (its one fed token is its last sampled one),
has no repetition / presence / frequency penalty (those change after every accepted token) and no
structured-output constraint (its matcher would have to check every draft; constrained rows gain from
fast-forward instead, infer/structured), gets
d <= k drafts capped by the tokens it may still generate minus one, by the step's unused
max_num_batched_tokens, and by free KV blocks (drafts never preempt anyone). Every other row, and
a row whose proposer finds nothing, decodes one token as usual in the same step.
"""
from __future__ import annotations

import numpy as np
import torch

from tinystack.config import InferConfig
from tinystack.infer.block_manager import BlockManager
from tinystack.infer.draft_model import Draft, DraftModel, load_draft
from tinystack.infer.sampler import has_penalties, logprob_info, sampling_probs
from tinystack.infer.sequence import Sequence
from tinystack.sampling_params import is_greedy


def lookup(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Prompt lookup: the k tokens that followed the latest earlier occurrence of the last n tokens,
    trying n = max_n down to min_n; [] when no n-gram of those sizes occurred before."""
    arr = np.asarray(tokens)
    for n in range(min(max_n, len(arr) - 1), min_n - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)  # windows ending before the last token
        hits = np.flatnonzero((windows == arr[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return arr[start:start + k].tolist()
    return []


class PromptLookup:
    """Drafts from the sequence's own tokens (prompt + output): no model, no state."""

    def __init__(self, k: int, min_n: int = 1, max_n: int = 3):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"prompt lookup n-gram sizes need 1 <= min <= max, got {min_n}, {max_n}")
        self.k, self.min_n, self.max_n = k, min_n, max_n

    def propose(self, rows: list[tuple[Sequence, int]]) -> list[Draft]:
        return [Draft(lookup(seq.token_ids, limit, self.min_n, self.max_n)) for seq, limit in rows]


def may_speculate(seq: Sequence, n: int) -> bool:
    """A decode row whose next tokens do not depend on penalties or a constraint (see the module docstring)."""
    return (n == 1 and seq.num_computed + 1 == seq.num_tokens and bool(seq.output_ids)
            and not has_penalties(seq.params) and seq.matcher is None)


class Speculator:
    """Proposes drafts for a step's batch, verifies the target's logits against them, rolls back the KV cache.
    `proposed_tokens` / `accepted_tokens` are engine totals (Prometheus); each Sequence counts its own."""

    def __init__(self, proposer, k: int, block_manager: BlockManager, max_num_batched_tokens: int):
        if k < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {k}")
        self.proposer, self.k, self.bm = proposer, k, block_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        self.proposed_tokens = self.accepted_tokens = 0

    def propose(self, batch: list[tuple[Sequence, int]]) -> list[Draft] | None:
        """Per row a Draft (empty where it does not speculate), blocks grown for it; None if no row drafts."""
        spare = self.max_num_batched_tokens - sum(n for _, n in batch)
        rows = [(i, seq, min(self.k, seq.max_new_tokens - len(seq.output_ids) - 1)) for i, (seq, n) in enumerate(batch)
                if may_speculate(seq, n)]
        rows = [(i, seq, limit) for i, seq, limit in rows if limit > 0]
        if spare <= 0 or not rows:
            return None
        drafts = [Draft([]) for _ in batch]
        for (i, seq, limit), draft in zip(rows, self.proposer.propose([(seq, limit) for _, seq, limit in rows])):
            d = min(len(draft.tokens), limit, spare)
            while d and not self.bm.can_grow(seq, 1 + d):  # never preempt for a guess
                d -= 1
            if d:
                self.bm.grow(seq, 1 + d)
                drafts[i] = Draft(draft.tokens[:d], None if draft.q is None else draft.q[:d])
                spare -= d
        return drafts if any(d.tokens for d in drafts) else None

    def verify(self, seq: Sequence, draft: Draft, logits: torch.Tensor) -> tuple[list[int], list[dict | None]]:
        """logits [d + 1, V] of the target at the row's fed positions -> the tokens to append (1 to d + 1) and
        their logprob records (None each unless the request asked for logprobs)."""
        p = seq.params
        logits = logits.float()
        self.proposed_tokens += len(draft.tokens)
        seq.metrics.spec_proposed += len(draft.tokens)
        if is_greedy(p):
            target = logits.argmax(dim=-1).tolist()
            a = 0
            while a < len(draft.tokens) and draft.tokens[a] == target[a]:
                a += 1
            out = draft.tokens[:a] + [target[a]]
        else:
            out = _rejection_sample(sampling_probs(logits, p), draft, seq.generator)
        self.accepted_tokens += len(out) - 1
        seq.metrics.spec_accepted += len(out) - 1
        if p.logprobs is None:
            return out, [None] * len(out)
        lp = logits.log_softmax(dim=-1)  # the target's raw distribution, as for plain decoding
        return out, [logprob_info(lp[j], t, p.logprobs) for j, t in enumerate(out)]

    def rollback(self, seq: Sequence, num_accepted: int) -> None:
        """After the engine appended the verified tokens: the accepted drafts' keys/values are valid (they were
        computed with the right prefix), the rejected ones' are not; free the blocks holding only those."""
        if seq.is_finished:  # its blocks are already released
            return
        seq.num_computed += num_accepted
        assert seq.num_computed == seq.num_tokens - 1, (seq.num_computed, seq.num_tokens)
        self.bm.truncate(seq)
        self.bm.commit(seq)


def _rejection_sample(p: torch.Tensor, draft: Draft, generator: torch.Generator | None) -> list[int]:
    """p [d + 1, V] target probabilities; accept d_i with min(1, p/q), else draw from norm(max(0, p - q))."""
    for i, tok in enumerate(draft.tokens):
        q_tok = 1.0 if draft.q is None else float(draft.q[i, tok])
        u = float(torch.rand((), generator=generator, device=p.device))
        if u * q_tok < float(p[i, tok]):  # u < p/q without dividing by a q that may be tiny
            continue
        if draft.q is None:
            residual = p[i].clone()
            residual[tok] = 0.0
        else:
            residual = (p[i] - draft.q[i].to(p.dtype)).clamp_min(0.0)
        if float(residual.sum()) <= 0.0:  # p == q up to rounding: rejection had probability ~0
            residual = p[i]
        return draft.tokens[:i] + [int(torch.multinomial(residual, 1, generator=generator))]
    return draft.tokens + [int(torch.multinomial(p[-1], 1, generator=generator))]


def build_speculator(config: InferConfig, *, block_manager: BlockManager, draft=None,
                     target: torch.nn.Module | None = None, tokenizer=None, token_slots: int = 0) -> Speculator | None:
    """The engine's speculator for [infer] speculative ("off" -> None), num_speculative_tokens (k),
    prompt_lookup_min/max and draft_model. For "draft": a ready proposer (draft_model.DraftModel, or any
    object with its methods) as `draft`, or config.draft_model (a directory) loaded and checked against
    `target` and `tokenizer`, with a cache of `token_slots` tokens."""
    mode, k, max_num_batched_tokens = config.speculative, config.num_speculative_tokens, config.max_num_batched_tokens
    if mode == "off":
        return None
    if target is not None and getattr(target, "needs_full_sequence", False):
        raise ValueError("speculative decoding needs the torch backend (the numpy one has no KV cache)")
    if mode == "prompt_lookup":
        return Speculator(PromptLookup(k, config.prompt_lookup_min, config.prompt_lookup_max), k, block_manager,
                          max_num_batched_tokens)
    if draft is None or isinstance(draft, torch.nn.Module):  # a proposer is used as given; a model is wrapped
        source = config.draft_model if draft is None else draft
        if not source:
            raise ValueError("speculative='draft' needs draft_model (a model directory)")
        device = next(target.parameters()).device
        model = load_draft(source, target, tokenizer, device)
        draft = DraftModel(model, k, token_slots, device, config.hugepages)
    return Speculator(draft, k, block_manager, max_num_batched_tokens)
