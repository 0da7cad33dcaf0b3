"""Turning next-token logits into a token, per request: penalties, greedy or sampled.

Order of operations (the same as Hugging Face's and vLLM's):
    penalties: repetition (prompt + output tokens: positive logits / p, negative * p),
               presence and frequency (output tokens: - presence - frequency * count),
               then logit_bias (OpenAI's: a bias per token id added to its logit; -100 bans it in effect)
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

import math
from dataclasses import dataclass, field, fields
from numbers import Real
from typing import Any, Sequence

import torch

SAMPLING_EPS = 1e-5  # temperatures below this are greedy
SEED_MAX = 2**63 - 1  # torch.Generator.manual_seed's range
LOGIT_BIAS_MAX = 100.0  # OpenAI's: a bias is in [-100, 100]


def is_greedy(p: SamplingParams) -> bool:
    return p.temperature < SAMPLING_EPS


def _knob(kind: type, default: Any, doc: str, *, model_default: bool = False, alias: dict | None = None,
          **bounds: float) -> Any:
    """A numeric field of SamplingParams: its range in pydantic's words (ge / gt / le), so a request schema takes
    it as it is; `model_default`: a model's generation_config.json may set it; `alias`: another spelling of a
    value (top_k's -1, vLLM's "off", is 0)."""
    return field(default=default, metadata={"knob": dict(kind=kind, doc=doc, model_default=model_default,
                                                         alias=alias or {}, bounds=bounds)})


@dataclass(frozen=True)
class SamplingParams:
    """Per-request generation settings (vLLM's names); invalid values raise a one-line ValueError with the reason.

    The numeric fields, declared with `_knob`, are the one table of sampling parameters (KNOBS below): their
    names, defaults and ranges are what the OpenAI and /generate request schemas, the `tinystack generate`
    flags and the generation_config.json reader are built from or check against. The ranges are OpenAI's where
    it has the parameter, else vLLM's."""

    max_tokens: int = _knob(int, 64, "New tokens to generate at most.", ge=1)
    temperature: float = _knob(float, 1.0, "0 = greedy (below 1e-5 is greedy too).", model_default=True,
                               ge=0.0, le=2.0)
    top_k: int = _knob(int, 0, "Sample from the k most likely tokens; 0 or -1 = off.", model_default=True,
                       alias={-1: 0}, ge=-1)
    top_p: float = _knob(float, 1.0, "Nucleus: the smallest set of tokens reaching this mass; 1 = off.",
                         model_default=True, gt=0.0, le=1.0)
    seed: int | None = _knob(int, None, "Same seed + same request = same output.", ge=0, le=SEED_MAX)
    min_p: float = _knob(float, 0.0, "Drop tokens below min_p x the top token's probability; 0 = off.",
                         model_default=True, ge=0.0, le=1.0)
    stop: tuple[str, ...] = ()  # stop strings: generation ends before the first one (not included in text)
    stop_token_ids: tuple[int, ...] = ()  # like EOS: ends generation, not included in the output
    repetition_penalty: float = _knob(float, 1.0, "Divides seen tokens' positive logits (multiplies negative "
                                      "ones); 1 = off.", model_default=True, gt=0.0)
    presence_penalty: float = _knob(float, 0.0, "Subtracted from the logit of every token already generated.",
                                    ge=-2.0, le=2.0)
    frequency_penalty: float = _knob(float, 0.0, "Subtracted from a token's logit once per time it was generated.",
                                     ge=-2.0, le=2.0)
    ignore_eos: bool = False  # keep going past EOS (benchmarks), still stopping at max_tokens
    logprobs: int | None = _knob(int, None, "Logprobs of the chosen token and of the n most likely; null = off.",
                                 ge=0, le=20)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100]); a dict is accepted

    def __post_init__(self) -> None:
        for name, knob in KNOBS.items():  # frozen: the checked value (an int as a float, an alias) set in place
            object.__setattr__(self, name, knob.check(getattr(self, name)))
        # lists are accepted for convenience; stored as tuples so params stay hashable and frozen
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        bias = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
        object.__setattr__(self, "logit_bias", tuple(sorted((int(t), float(b)) for t, b in bias)))
        if any(t < 0 or not -LOGIT_BIAS_MAX <= b <= LOGIT_BIAS_MAX for t, b in self.logit_bias):
            raise ValueError("logit_bias maps token ids (>= 0) to biases in [-100, 100]")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")

    def bias_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """logit_bias as (ids, biases) tensors, built once per params (a request may bias thousands of tokens,
        and the sampler applies them every step). Kept beside the fields: not part of equality or hashing."""
        cached = self.__dict__.get("_bias")
        if cached is None:
            cached = (torch.tensor([t for t, _ in self.logit_bias], dtype=torch.long),
                      torch.tensor([b for _, b in self.logit_bias], dtype=torch.float32))
            object.__setattr__(self, "_bias", cached)
        return cached


@dataclass(frozen=True)
class Knob:
    """One numeric sampling parameter, as SamplingParams declares it."""

    name: str
    default: Any
    kind: type  # int or float
    doc: str
    model_default: bool  # a model's generation_config.json may set it
    alias: dict
    bounds: dict[str, float]  # pydantic's names: ge, gt, le

    def describe(self) -> str:
        """The range in words: "in [0.0, 2.0]", "in (0.0, 1.0]", ">= 1", "> 0.0"."""
        b = self.bounds
        low = ("[", b["ge"]) if "ge" in b else ("(", b["gt"]) if "gt" in b else None
        if low and "le" in b:
            return f"in {low[0]}{low[1]!r}, {b['le']!r}]"
        if low:
            return f"{'>=' if low[0] == '[' else '>'} {low[1]!r}"
        return f"<= {b['le']!r}" if "le" in b else "any number"

    def check(self, value: Any) -> Any:
        """`value` as SamplingParams holds it (an int as a float, a whole float as an int, an alias resolved);
        None stays None where it is the default; else a one-line ValueError naming the parameter."""
        if value is None and self.default is None:
            return None
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) \
                or (self.kind is int and value != int(value)):
            raise ValueError(f"{self.name} must be a number{' (whole)' if self.kind is int else ''}, got {value!r}")
        b = self.bounds
        if ("ge" in b and value < b["ge"]) or ("gt" in b and value <= b["gt"]) or ("le" in b and value > b["le"]):
            raise ValueError(f"{self.name} must be {self.describe()}, got {value}")
        value = self.kind(value)
        return self.alias.get(value, value)


# The one table of sampling parameters: SamplingParams' numeric fields, in declaration order.
KNOBS: dict[str, Knob] = {f.name: Knob(f.name, f.default, **f.metadata["knob"])
                          for f in fields(SamplingParams) if "knob" in f.metadata}


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
                    output_ids: Sequence[int]) -> torch.Tensor:
    """One row of logits [V] with the repetition / presence / frequency penalties and the logit bias applied
    (a new tensor)."""
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
    return logits


def has_penalties(p: SamplingParams) -> bool:
    """Anything apply_penalties changes (such rows are processed one by one and never speculated)."""
    return p.repetition_penalty != 1.0 or bool(p.presence_penalty) or bool(p.frequency_penalty) or bool(p.logit_bias)


@dataclass
class SampleRow:
    """What the sampler needs of one request: its params, generator and tokens so far."""

    params: SamplingParams
    generator: torch.Generator | None
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]


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
        row = apply_penalties(logits[i], p, r.prompt_ids, r.output_ids) if has_penalties(p) else logits[i]
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

