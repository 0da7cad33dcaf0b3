"""Turning next-token logits into a token, per request: penalties, greedy or sampled.

Order of operations (the same as Hugging Face's and vLLM's):
    penalties: repetition (prompt + output tokens: positive logits / p, negative * p),
               presence and frequency (output tokens: - presence - frequency * count),
               then logit_bias (OpenAI's: a bias per token id added to its logit; -100 bans it in effect),
               then, while fewer than min_tokens were generated, EOS and stop_token_ids banned (vLLM's)
    temperature < 1e-5: greedy (argmax of the penalised logits), the other knobs are ignored
               (as vLLM: dividing by a subnormal temperature overflows to inf and NaN)
    else: / temperature -> top-k -> top-p (smallest set reaching mass p, at least the top
          token) -> min-p (drop tokens below min_p * the top probability) -> one draw from
          the renormalised distribution with the request's own seeded generator.
`sample_batch` is the one sampler (the engine's): it does this for a batch whose rows have
different params; each row draws only from its own generator, so a seed reproduces
whatever else is in the batch.
Logprobs, when asked for, are of the model's raw distribution (log-softmax of the
unprocessed logits), as vLLM reports them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from tinystack.sampling_params import SamplingParams, is_greedy


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Set everything below the k-th largest logit (per row) to -inf. logits [B, V]."""
    if k <= 0 or k >= logits.size(-1):
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest prefix of tokens (by probability) whose mass reaches p. logits [B, V]."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    # drop a token when the mass *before* it already reaches p; the top token is never dropped
    # (explicitly: a p below float32's smallest value rounds to 0, and 0 >= 0 would drop it)
    drop_sorted = (cum - sorted_logits.softmax(dim=-1)) >= p
    drop_sorted[..., 0] = False
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the most likely token's. logits [B, V]."""
    if min_p <= 0.0:
        return logits
    probs = logits.softmax(dim=-1)
    return logits.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, float("-inf"))


def apply_penalties(logits: torch.Tensor, params: SamplingParams, prompt_ids: Sequence[int],
                    output_ids: Sequence[int], eos_ids: Sequence[int] = ()) -> torch.Tensor:
    """One row of logits [V] with the repetition / presence / frequency penalties, the logit bias and the
    min_tokens ban (of `eos_ids` and params.stop_token_ids) applied (a new tensor)."""
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(prompt_ids) | set(output_ids)), dtype=torch.long, device=logits.device)
        if seen.numel():
            vals = logits[seen]
            logits = logits.clone()
            logits[seen] = torch.where(vals > 0, vals / params.repetition_penalty, vals * params.repetition_penalty)
    if (params.presence_penalty or params.frequency_penalty) and output_ids:
        counts = torch.bincount(torch.tensor(list(output_ids), device=logits.device), minlength=logits.numel())
        counts = counts[: logits.numel()].to(logits.dtype)
        logits = logits - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).to(logits.dtype)
    if params.logit_bias:  # ids checked against the vocabulary when the request was added (LLMEngine)
        ids, bias = params.bias_tensors()
        logits = logits.index_add(0, ids.to(logits.device), bias.to(logits.device, logits.dtype))
    if len(output_ids) < params.min_tokens:
        banned = [t for t in {*eos_ids, *params.stop_token_ids} if 0 <= t < logits.numel()]
        logits = logits.index_fill(0, torch.tensor(banned, dtype=torch.long, device=logits.device), float("-inf"))
    return logits


def has_penalties(p: SamplingParams) -> bool:
    """Anything apply_penalties changes (such rows are processed one by one and never speculated)."""
    return (p.repetition_penalty != 1.0 or bool(p.presence_penalty) or bool(p.frequency_penalty)
            or bool(p.logit_bias) or p.min_tokens > 0)


@dataclass
class SampleRow:
    """What the sampler needs of one request: its params, generator and tokens so far, and the model's EOS ids
    (banned until params.min_tokens were generated)."""

    params: SamplingParams
    generator: torch.Generator | None
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    eos_ids: Sequence[int] = ()


def sample_batch(logits: torch.Tensor, rows: Sequence[SampleRow]) -> tuple[list[int], list[dict | None]]:
    """logits [B, V], one SampleRow per row -> (token ids, per row None or {"logprob", "top"}).

    Rows that are greedy and unpenalised share one vectorised argmax; the rest are
    processed one by one (each has its own filters and generator).
    """
    logits = logits.float()
    tokens = logits.argmax(dim=-1).tolist()
    for i, r in enumerate(rows):
        p = r.params
        if is_greedy(p) and not has_penalties(p):
            continue
        row = apply_penalties(logits[i], p, r.prompt_ids, r.output_ids, r.eos_ids) if has_penalties(p) else logits[i]
        if is_greedy(p):
            tokens[i] = int(row.argmax())
            continue
        tokens[i] = int(torch.multinomial(sampling_probs(row[None], p), 1, generator=r.generator))
    infos: list[dict | None] = [None] * len(rows)
    want = [i for i, r in enumerate(rows) if r.params.logprobs is not None]
    if want:
        lp = logits[want].log_softmax(dim=-1)
        for j, i in enumerate(want):
            infos[i] = logprob_info(lp[j], tokens[i], rows[i].params.logprobs)
    return tokens, infos


def sampling_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The distribution a non-greedy row draws from: logits [B, V] (penalties applied) -> / temperature ->
    top-k -> top-p -> min-p -> softmax [B, V]. Speculative verification (speculative.py) holds drafts to it."""
    row = logits.float() / p.temperature
    return min_p_filter(top_p_filter(top_k_filter(row, p.top_k), p.top_p), p.min_p).softmax(dim=-1)


def logprob_info(logprobs: torch.Tensor, token: int, n: int) -> dict:
    """{"logprob": the chosen token's, "top": the n most likely {id: logprob}} from one row of log-softmax [V]."""
    top = torch.topk(logprobs, n) if n else None
    return {"logprob": float(logprobs[token]),
            "top": {int(t): float(v) for t, v in zip(top.indices, top.values)} if top is not None else {}}

