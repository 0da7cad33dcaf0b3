"""`SamplingParams`: what a request asks of the sampler (vLLM's names; vllm/sampling_params.py's place).

Its numeric fields, declared with `_knob`, are the one table of sampling parameters (`KNOBS`): name, default
and allowed range. The OpenAI and /generate request schemas (serve/api), the `tinystack generate` flags'
checks (infer/commands.py) and a model directory's generation_config.json reader (model/generation_config.py)
are built from it or check against it. It sits at the package's base, beside config.py, so every layer that
reads sampling values (the model directory's files included) can use it without importing the engine; the
sampler that applies them is infer/sampler.py.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from numbers import Real
from typing import Any, ClassVar

import torch

SAMPLING_EPS = 1e-5  # temperatures below this are greedy
SEED_MAX = 2**63 - 1  # torch.Generator.manual_seed's range
LOGIT_BIAS_MAX = 100.0  # OpenAI's: a bias is in [-100, 100]


@dataclass(frozen=True)
class StructuredOutputs:
    """A constraint on what a request may generate (vLLM's StructuredOutputsParams names); exactly one kind is set.

    json: a JSON Schema (a dict, or its JSON text); json_object: any JSON object; regex: the whole output matches;
    choice: the output is one of these strings; grammar: a grammar in llguidance's Lark syntax;
    structural_tag: vLLM's {"structures": [{"begin", "schema", "end"}], "triggers": [...]} (free text until a
    trigger, then the structure: how `tool_choice: "auto"` constrains only the tool call). The engine compiles it
    with llguidance (infer/structured); what cannot compile is a GrammarError naming the kind. Dicts are held as
    compact JSON text so the params stay hashable, and compiled grammars are cached by it."""

    KINDS: ClassVar[tuple[str, ...]] = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")

    json: str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    structural_tag: str | None = None

    def __post_init__(self) -> None:
        for name in ("json", "structural_tag"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):  # a dict: its compact text, the cache key
                # (keys keep their order: a schema's property order is the order the output is generated in)
                object.__setattr__(self, name, json.dumps(value, separators=(",", ":")))
        if self.choice is not None:
            if isinstance(self.choice, str) or not all(isinstance(c, str) for c in self.choice):
                raise ValueError("choice must be a list of strings")
            object.__setattr__(self, "choice", tuple(self.choice))
            if not self.choice:
                raise ValueError("choice must list at least one string")
        kinds = [k for k in self.KINDS if getattr(self, k) not in (None, False)]
        if len(kinds) != 1:
            raise ValueError(f"structured_outputs takes exactly one of {', '.join(self.KINDS)}; got "
                             f"{', '.join(kinds) or 'none'}")

    @property
    def kind(self) -> str:
        return next(k for k in self.KINDS if getattr(self, k) not in (None, False))


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
    min_tokens: int = _knob(int, 0, "Tokens generated before EOS, stop_token_ids or a stop string may end the "
                                    "output (vLLM's); at most max_tokens.", ge=0)
    # [0.01, 10], not vLLM's "> 0": a penalty near 0 divides a logit into inf and the draw fails (the fuzz test
    # found 1e-323 turning into NaN probabilities and engine failures)
    repetition_penalty: float = _knob(float, 1.0, "Divides seen tokens' positive logits (multiplies negative "
                                      "ones); 1 = off.", model_default=True, ge=0.01, le=10.0)
    presence_penalty: float = _knob(float, 0.0, "Subtracted from the logit of every token already generated.",
                                    ge=-2.0, le=2.0)
    frequency_penalty: float = _knob(float, 0.0, "Subtracted from a token's logit once per time it was generated.",
                                     ge=-2.0, le=2.0)
    ignore_eos: bool = False  # keep going past EOS (benchmarks), still stopping at max_tokens
    logprobs: int | None = _knob(int, None, "Logprobs of the chosen token and of the n most likely; null = off.",
                                 ge=0, le=20)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100]); a dict is accepted
    structured_outputs: StructuredOutputs | None = None  # what the output must match (infer/structured)
    priority: int = 0  # vLLM's: lower runs first (admission, and last to be preempted); equal priorities: FCFS

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
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be at most max_tokens ({self.max_tokens})")
        if self.min_tokens and self.structured_outputs is not None:  # the constraint decides where it ends
            raise ValueError("min_tokens cannot be combined with a structured output constraint")

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
