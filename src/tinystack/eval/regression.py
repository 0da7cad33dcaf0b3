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

Loss-type cases score as nats per byte of the target (its total negative log-probability over its
UTF-8 bytes), so `tolerance` (nats/byte) means the same for both, and the score does not depend on
the tokenizer: a candidate whose tokenizer was retrained on new data is compared with the current
model on the same scale (per token, a tokenizer with longer tokens scores worse on the same text).
Comparing a NEW model with a BASELINE, a case *regresses*
when it passed on the baseline and fails on the new model, or when its score got
worse by more than its tolerance; the mean score of the loss-type cases is gated
the same way. Greedy decoding and fixed prompts make a run deterministic.

`calibrate` turns scores measured on a reference model into thresholds (score plus
tolerance), so a case file is a meaningful gate on its own, without re-running that model.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tinystack.atomic import atomic_open
from tinystack.config import EvalConfig
from tinystack.eval.generation import complete, repetition_rate
from tinystack.eval.scoring import target_nats
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

    def __post_init__(self) -> None:
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
            f.write(json.dumps({k: v for k, v in asdict(c).items() if v is not None}, ensure_ascii=False) + "\n")


def build_cases(records: Sequence[dict[str, Any]], n_cases: int, threshold: float, *, prompt_chars: int = 120,
                target_chars: int = 40, prefix: str = "heldout", tokenizer: Any = None,
                max_target_tokens: int = 0) -> list[Case]:
    """max_loss cases from held-out records: the start of a document as prompt, what follows as target.

    Records are taken evenly spaced (deterministic); the cut falls on a space so the
    target starts a word. `threshold` is the loss a case must beat in nats per token (e.g.
    ln(vocab), a uniform guess), stored per byte of each target: threshold x its tokens / its
    bytes (one token a byte without a tokenizer). With a tokenizer, targets are also shortened
    to `max_target_tokens` tokens so they fit the model's context.
    """
    usable = [r for r in records if len(r["text"]) >= 2 * target_chars]
    if not usable or n_cases <= 0:
        return []
    picks = np.unique(np.linspace(0, len(usable) - 1, min(n_cases, len(usable))).round().astype(int))
    cases = []
    for i in picks:
        text = usable[i]["text"]
        cut = min(prompt_chars, len(text) - target_chars)
        space = text.rfind(" ", max(1, cut // 2), cut)
        cut = space if space > 0 else cut
        target = text[cut:cut + target_chars]
        while tokenizer is not None and len(target) > 1 and len(tokenizer.encode_ordinary(target)) > max_target_tokens:
            target = target[:-1]
        cid = f"{prefix}-{usable[i].get('id', i)}"
        cid = cid if all(c.id != cid for c in cases) else f"{cid}-{i}"  # ids must stay unique
        n_bytes = max(1, len(target.encode("utf-8")))
        n_tokens = len(tokenizer.encode_ordinary(target)) if tokenizer is not None else n_bytes
        cases.append(Case(id=cid, prompt=text[:cut], expect="max_loss", target=target,
                          threshold=round(threshold * n_tokens / n_bytes, 4)))
    return cases


def _loss_case(model: GPT, tokenizer: Any, case: Case, device: str) -> dict[str, Any]:
    context = [tokenizer.eos_token_id, *tokenizer.encode_ordinary(case.prompt)]
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


def run_case(model: GPT, tokenizer: Any, case: Case, device: str = "cpu") -> dict[str, Any]:
    """{id, expect, passed, score, detail} for one case on one model."""
    return run_cases(model, tokenizer, [case], device)["cases"][0]


def run_cases(model: GPT, tokenizer: Any, cases: Sequence[Case], device: str = "cpu") -> dict[str, Any]:
    """Every case on one model: loss cases scored one by one, the generation cases greedily in one batch."""
    from tinystack.infer import SamplingParams

    gen = [c for c in cases if c.expect not in LOSS_KINDS]
    texts = complete(model, tokenizer, [c.prompt for c in gen],
                     [SamplingParams(temperature=0.0, max_tokens=c.max_tokens) for c in gen], device=device)
    out_of = {id(c): out for c, out in zip(gen, texts)}
    results = [_loss_case(model, tokenizer, c, device) if c.expect in LOSS_KINDS
               else _generation_case(c, *out_of[id(c)]) for c in cases]
    losses = [r["score"] for r in results if r["expect"] in LOSS_KINDS]
    return {"cases": results, "passed": sum(r["passed"] for r in results), "total": len(results),
            "mean_loss": float(np.mean(losses)) if losses else None}


def generation_cases(prompts: Sequence[str], *, max_tokens: int = 32, max_repetition: float = 1.0,
                     forbidden: Sequence[str] = ("\ufffd",), prefix: str = "gen") -> list[Case]:
    """Generation cases for each prompt: the greedy continuation's repetition share (at most `max_repetition`;
    the default bar is none, `calibrate` sets it from a reference model's share) and no `forbidden` string
    (by default U+FFFD: broken UTF-8). Small models loop under greedy decoding, so "no more looping than the
    current model" is the bar that means something for them."""
    cases = []
    for i, prompt in enumerate(prompts):
        cases.append(Case(id=f"{prefix}-{i}-repetition", prompt=prompt, expect="max_repetition", target="",
                          threshold=max_repetition, max_tokens=max_tokens))
        cases += [Case(id=f"{prefix}-{i}-forbid-{j}", prompt=prompt, expect="not_contains", target=s,
                       max_tokens=max_tokens) for j, s in enumerate(forbidden)]
    return cases


def calibrate(cases: Sequence[Case], results: dict[str, Any], tolerance: float,
              repetition_margin: float = 0.1) -> list[Case]:
    """Cases whose thresholds come from a reference model's `results` (run_cases): a loss case's bar becomes
    that model's loss + `tolerance` (min_logprob: its log-probability - tolerance x bytes), a repetition
    case's its share + `repetition_margin` (capped at its current bar); pass/fail cases stay as they are."""
    by_id = {r["id"]: r for r in results["cases"]}
    out = []
    for c in cases:
        r = by_id[c.id]
        if c.expect == "max_loss":
            c = replace(c, threshold=round(r["score"] + tolerance, 4))
        elif c.expect == "min_logprob":
            c = replace(c, threshold=round(r["detail"]["logprob"] - tolerance * r["detail"]["target_bytes"], 4))
        elif c.expect == "max_repetition":
            c = replace(c, threshold=round(min(c.threshold, r["score"] + repetition_margin), 4))
        out.append(c)
    return out


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
