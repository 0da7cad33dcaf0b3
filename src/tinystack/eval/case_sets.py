"""Where regression cases come from (eval/regression.py runs and compares them):

    build_cases(records, n, threshold)          max_loss cases from held-out documents (`tinystack run`)
    build_chat_cases(conversations, n, ...)     chat max_loss cases from held-out conversations (`finetune`)
    generation_cases(prompts)                   repetition and forbidden-string checks on greedy continuations
    calibrate(cases, results, tolerance)        thresholds from a reference model's scores (promotion)
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import numpy as np

from tinystack.eval.regression import Case


def _evenly(n_items: int, n_cases: int) -> list[int]:
    """Indices of up to n_cases of n_items, evenly spaced (deterministic)."""
    if n_items <= 0 or n_cases <= 0:
        return []
    return [int(i) for i in np.unique(np.linspace(0, n_items - 1, min(n_cases, n_items)).round().astype(int))]


def _unique_id(cid: str, cases: Sequence[Case], i: int) -> str:
    return cid if all(c.id != cid for c in cases) else f"{cid}-{i}"  # ids must stay unique (load_cases checks)


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
    cases: list[Case] = []
    for i in _evenly(len(usable), n_cases):
        text = usable[i]["text"]
        cut = min(prompt_chars, len(text) - target_chars)
        space = text.rfind(" ", max(1, cut // 2), cut)
        cut = space if space > 0 else cut
        target = text[cut:cut + target_chars]
        while tokenizer is not None and len(target) > 1 and len(tokenizer.encode_ordinary(target)) > max_target_tokens:
            target = target[:-1]
        cid = _unique_id(f"{prefix}-{usable[i].get('id', i)}", cases, i)
        n_bytes = max(1, len(target.encode("utf-8")))
        n_tokens = len(tokenizer.encode_ordinary(target)) if tokenizer is not None else n_bytes
        cases.append(Case(id=cid, prompt=text[:cut], expect="max_loss", target=target,
                          threshold=round(threshold * n_tokens / n_bytes, 4)))
    return cases


def build_chat_cases(conversations: Sequence[tuple[str, list[dict[str, str]]]], n_cases: int, threshold: float,
                     tokenizer: Any, *, max_target_tokens: int, prefix: str = "heldout") -> list[Case]:
    """max_loss chat cases from (id, messages) conversations, evenly spaced: the first trained assistant turn
    (not one with "weight": 0) as the target (cut to `max_target_tokens` tokens), after all that precedes it as
    served: the last user message before it as the prompt, the system message if the conversation opens with
    one, and the turns in between as the history. `threshold` in nats per token, stored per byte as in
    build_cases."""
    usable = []
    for cid, messages in conversations:
        first = next((i for i, m in enumerate(messages)  # a turn trained with weight 0 is context, not an answer
                      if m["role"] == "assistant" and m.get("weight", 1) != 0), None)
        user = max((i for i, m in enumerate(messages[:first or 0]) if m["role"] == "user"), default=None)
        if first is not None and user is not None and messages[first]["content"].strip():
            opens = messages[0]["role"] == "system"
            system = messages[0]["content"] if opens else None
            history = [{"role": m["role"], "content": m["content"]} for m in messages[int(opens):user]]
            if all(m["role"] in ("user", "assistant") for m in history):  # a later system turn: no case
                usable.append((cid, system, history or None, messages[user]["content"], messages[first]["content"]))
    cases: list[Case] = []
    for i in _evenly(len(usable), n_cases):
        cid, system, history, prompt, target = usable[i]
        ids = tokenizer.encode_ordinary(target)[:max_target_tokens]
        target = tokenizer.decode(ids).rstrip("\ufffd")  # a cut inside a character leaves half of it
        if not target.strip():
            continue
        n_bytes = len(target.encode("utf-8"))
        cases.append(Case(id=_unique_id(f"{prefix}-{cid}", cases, i), prompt=prompt, expect="max_loss",
                          target=target, chat=True, system=system, history=history,
                          threshold=round(threshold * len(ids) / n_bytes, 4)))
    return cases


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
