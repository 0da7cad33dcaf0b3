"""The regression set: prompts with expectations, run on a model and compared with a baseline.

A case is one JSON line:

    {"id": "val-3", "prompt": "Return the", "expect": "max_loss", "target": " number of items",
     "threshold": 5.5, "max_tokens": 32, "tolerance": 0.05}

    expect          passes when                                               score (lower = better)
    exact           the greedy continuation starts with `target`              0 pass / 1 fail
    contains        `target` occurs in the greedy continuation                0 / 1
    not_contains    `target` (a forbidden string) does not occur in it        0 / 1
    regex           re.search(target, greedy continuation) matches            0 / 1
    max_repetition  share of repeated 4-gram tokens in it <= threshold        that share (0..1)
    max_loss        nats per UTF-8 byte of `target` after `prompt` <= threshold    that loss
    min_logprob     total log-probability of `target` >= threshold              that loss

With `"chat": true` the prompt is a user's message (after an optional `"system"` one and, for a later turn of a
conversation, the turns before it as `"history"`: [{"role": "user"|"assistant", "content": ...}, ...]), rendered
with the model directory's chat template and encoded with its special tokens, as `/v1/chat/completions` serves it: the
cases a fine-tuned chat model is gated on (`tinystack finetune` writes them from its held-out conversations).

Loss-type cases score as nats per byte of the target (its total negative log-probability over its
UTF-8 bytes), so `tolerance` (nats/byte) means the same for both, and the score does not depend on
the tokenizer: a candidate whose tokenizer was retrained on new data is compared with the current
model on the same scale (per token, a tokenizer with longer tokens scores worse on the same text).
Comparing a NEW model with a BASELINE, a case *regresses*
when it passed on the baseline and fails on the new model, or when its score got
worse by more than its tolerance; the mean score of the loss-type cases is gated
the same way. Greedy decoding and fixed prompts make a run deterministic.

Case sets (held-out documents and conversations, generation checks, `calibrate`): eval/case_sets.py.
`calibrate` turns scores measured on a reference model into thresholds (score plus
tolerance), so a case file is a meaningful gate on its own, without re-running that model.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tinystack.atomic import atomic_open
from tinystack.config import EvalConfig
from tinystack.eval.generation import complete, repetition_rate
from tinystack.eval.scoring import target_nats
from tinystack.infer import SamplingParams
from tinystack.infer.chat import encode_chat
from tinystack.model.gpt import GPT

KINDS = ("exact", "contains", "not_contains", "regex", "max_repetition", "max_loss", "min_logprob")
LOSS_KINDS = ("max_loss", "min_logprob")
THRESHOLD_KINDS = (*LOSS_KINDS, "max_repetition")


@dataclass
class Case:
    id: str
    prompt: str
    expect: str
    target: str
    threshold: float | None = None  # max_loss / min_logprob / max_repetition only
    max_tokens: int = 32  # generation length for exact / contains / regex
    tolerance: float | None = None  # None: the run's default
    chat: bool = False  # prompt = a user's message, in the model's chat template
    system: str | None = None  # chat only: a system message before it
    history: list[dict[str, str]] | None = None  # chat only: the user / assistant turns before `prompt`

    def __post_init__(self) -> None:
        if self.system is not None and not self.chat:
            raise ValueError(f"case {self.id}: a system message needs chat: true")
        if self.history is not None:
            if not self.chat:
                raise ValueError(f"case {self.id}: a history needs chat: true")
            if not isinstance(self.history, list) or not all(
                    isinstance(m, dict) and set(m) == {"role", "content"} and m["role"] in ("user", "assistant")
                    and isinstance(m["content"], str) for m in self.history):
                raise ValueError(f"case {self.id}: history must be a list of {{\"role\": \"user\"|\"assistant\", "
                                 f"\"content\": str}}")
        if self.expect not in KINDS:
            raise ValueError(f"case {self.id}: expect must be one of {KINDS}, got {self.expect!r}")
        if self.expect in THRESHOLD_KINDS and self.threshold is None:
            raise ValueError(f"case {self.id}: expect={self.expect} needs a threshold")
        if not self.target and self.expect != "max_repetition":
            raise ValueError(f"case {self.id}: empty target")
        if self.expect == "regex":
            re.compile(self.target)


def load_cases(path: str | Path) -> list[Case]:
    cases = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    d = json.loads(line)
                    d.setdefault("id", f"line-{n}")
                    cases.append(Case(**d))
                except (json.JSONDecodeError, TypeError, ValueError, re.error) as e:
                    raise ValueError(f"{path}:{n}: bad case: {e}") from None
    ids = [c.id for c in cases]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate case ids")
    return cases


def write_cases(path: str | Path, cases: Sequence[Case]) -> None:
    with atomic_open(path) as f:
        for c in cases:
            row = {k: v for k, v in asdict(c).items() if v is not None and not (k == "chat" and not v)}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _context(case: Case, tokenizer: Any, formatter: Any) -> list[int]:
    """The token ids a case's target follows: the chat prompt as served, or end-of-text + the plain prompt."""
    if not case.chat:
        return [tokenizer.eos_token_id, *tokenizer.encode_ordinary(case.prompt)]
    if formatter is None:
        raise ValueError(f"case {case.id} is a chat case: it needs the model directory's chat template")

    system = [{"role": "system", "content": case.system}] if case.system is not None else []
    history = case.history or []
    return encode_chat(tokenizer, formatter.render([*system, *history, {"role": "user", "content": case.prompt}]))


def _loss_case(model: GPT, tokenizer: Any, case: Case, device: str, formatter: Any = None) -> dict[str, Any]:
    context = _context(case, tokenizer, formatter)
    nats = target_nats(model, context, tokenizer.encode_ordinary(case.target), device=device)
    n_bytes = max(1, len(case.target.encode("utf-8")))
    logprob = -float(nats.sum())
    loss = -logprob / n_bytes
    passed = loss <= case.threshold if case.expect == "max_loss" else logprob >= case.threshold
    return {"id": case.id, "expect": case.expect, "passed": bool(passed), "score": loss,
            "detail": {"loss": loss, "logprob": logprob, "target_tokens": len(nats), "target_bytes": n_bytes}}


def _generation_case(case: Case, text: str, ids: list[int]) -> dict[str, Any]:
    if case.expect == "max_repetition":
        rep = repetition_rate(ids)
        return {"id": case.id, "expect": case.expect, "passed": rep <= case.threshold, "score": rep,
                "detail": {"completion": text, "repetition_rate": rep}}
    if case.expect == "exact":
        passed = text.startswith(case.target)
    elif case.expect == "contains":
        passed = case.target in text
    elif case.expect == "not_contains":
        passed = case.target not in text
    else:
        passed = re.search(case.target, text) is not None
    return {"id": case.id, "expect": case.expect, "passed": bool(passed), "score": 0.0 if passed else 1.0,
            "detail": {"completion": text}}


def run_case(model: GPT, tokenizer: Any, case: Case, device: str = "cpu", formatter: Any = None) -> dict[str, Any]:
    """{id, expect, passed, score, detail} for one case on one model."""
    return run_cases(model, tokenizer, [case], device, formatter)["cases"][0]


def run_cases(model: GPT, tokenizer: Any, cases: Sequence[Case], device: str = "cpu",
              formatter: Any = None) -> dict[str, Any]:
    """Every case on one model: loss cases scored one by one, the generation cases greedily in one batch.
    `formatter`: the model's chat formatter (infer.chat.chat_formatter), needed by chat cases."""

    gen = [c for c in cases if c.expect not in LOSS_KINDS]
    prompts = [_context(c, tokenizer, formatter) if c.chat else c.prompt for c in gen]
    texts = complete(model, tokenizer, prompts,
                     [SamplingParams(temperature=0.0, max_tokens=c.max_tokens) for c in gen], device=device)
    out_of = {id(c): out for c, out in zip(gen, texts)}
    results = [_loss_case(model, tokenizer, c, device, formatter) if c.expect in LOSS_KINDS
               else _generation_case(c, *out_of[id(c)]) for c in cases]
    losses = [r["score"] for r in results if r["expect"] in LOSS_KINDS]
    return {"cases": results, "passed": sum(r["passed"] for r in results), "total": len(results),
            "mean_loss": float(np.mean(losses)) if losses else None}


def compare(new: dict[str, Any], baseline: dict[str, Any], cases: Sequence[Case],
            tolerance: float = EvalConfig.regression_tolerance) -> dict[str, Any]:
    """Case-by-case table of NEW vs BASELINE; `regressed` is True when anything got worse beyond tolerance."""
    base_by_id = {r["id"]: r for r in baseline["cases"]}
    rows = []
    for case, r in zip(cases, new["cases"]):
        b = base_by_id[case.id]
        tol = case.tolerance if case.tolerance is not None else tolerance
        delta = r["score"] - b["score"]
        if b["passed"] and not r["passed"]:
            verdict = "worse"
        elif not b["passed"] and r["passed"]:
            verdict = "better"
        elif delta > tol:
            verdict = "worse"
        elif delta < -tol:
            verdict = "better"
        else:
            verdict = "same"
        rows.append({"id": case.id, "expect": case.expect, "baseline": b["score"], "new": r["score"],
                     "delta": delta, "baseline_passed": b["passed"], "new_passed": r["passed"],
                     "tolerance": tol, "verdict": verdict})
    summary = {"baseline_passed": baseline["passed"], "new_passed": new["passed"], "total": new["total"]}
    mean_delta = None
    if new["mean_loss"] is not None and baseline["mean_loss"] is not None:
        mean_delta = new["mean_loss"] - baseline["mean_loss"]
        summary.update(baseline_mean_loss=baseline["mean_loss"], new_mean_loss=new["mean_loss"],
                       mean_loss_delta=mean_delta)
    worse = [r["id"] for r in rows if r["verdict"] == "worse"]
    mean_worse = mean_delta is not None and mean_delta > tolerance
    summary.update(better=sum(r["verdict"] == "better" for r in rows), worse=len(worse),
                   same=sum(r["verdict"] == "same" for r in rows), mean_loss_regressed=bool(mean_worse),
                   regressed=bool(worse) or bool(mean_worse), tolerance=tolerance)
    return {"rows": rows, "summary": summary}


def compare_metrics(new: dict[str, Any], baseline: dict[str, Any], tolerance: float = 0.01,
                    metric: str = "bits_per_byte") -> list[dict[str, Any]]:
    """Split-level rows (val/test `metric`, lower = better); bits per byte by default because it
    stays comparable when NEW and BASELINE use different tokenizers."""
    rows = []
    for split in ("val", "test"):
        n, b = new.get(split, {}), baseline.get(split, {})
        if metric not in n or metric not in b:
            continue
        delta = n[metric] - b[metric]
        verdict = "worse" if delta > tolerance else "better" if delta < -tolerance else "same"
        rows.append({"id": f"{split} {metric}", "expect": "metric", "baseline": b[metric], "new": n[metric],
                     "delta": delta, "baseline_passed": True, "new_passed": verdict != "worse",
                     "tolerance": tolerance, "verdict": verdict})
    return rows
