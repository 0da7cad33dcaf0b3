"""The forgetting guard: after fine-tuning, does the model still answer what its base answered?

    general_prompts(n, file)     the built-in general prompts (general/guard_prompts.jsonl: facts, arithmetic,
                                 instructions, code; `n` of them spread evenly over the kinds) + the user's own
    replay_prompts(n)            other general prompts (general/replay_prompts.jsonl), for replay: never the
                                 guard's, so replay cannot teach the guard its own answers
    record(llm, formatter, prompts, max_tokens) -> Recorded
                                 the base model's greedy answers (text and token ids), before training
    answer_nll(model, ...)       mean nats per token of the recorded answers under a model, after their chat
                                 prompts as served (eval.scoring.score_batches)
    retention(...) -> dict       the two scores and the verdict:
        nll_increase     answer_nll(tuned) - answer_nll(base): how much less likely the tuned model finds the
                         base's own answers (a KL-style score: at the base's greedy answers, the mean over their
                         tokens of log p_base - log p_tuned); 0 = unchanged
        fact_retention   of the short factual prompts the base answered right (its answer holds the expected
                         word), the share the tuned model still answers right (greedy, same token budget)
        passed           nll_increase <= max_retention_nll and fact_retention >= min_fact_retention

Prompts carry {"id", "kind", "prompt", "answer"?}; "answer" (facts, arithmetic) is a short word that a right
reply contains, matched as a whole word, case-insensitive.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tinystack.eval.scoring import context_len, score_batches
from tinystack.infer.chat import encode_chat
from tinystack.nn.loss import IGNORE_INDEX
from tinystack.sampling_params import SamplingParams

GENERAL_DIR = Path(__file__).with_name("general")


@dataclass(frozen=True)
class GeneralPrompt:
    id: str
    kind: str
    prompt: str
    answer: str | None = None


@dataclass
class Recorded:
    """Greedy answers to `prompts`, in order."""

    prompts: list[GeneralPrompt]
    texts: list[str]
    token_ids: list[list[int]]
    finished: list[bool]  # ended by the model (EOS / stop), not by the token budget


def _read(path: Path, source: str) -> list[GeneralPrompt]:
    out = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            prompt = obj["prompt"]
            if not isinstance(prompt, str) or not prompt.strip():
                raise ValueError("empty prompt")
            answer = obj.get("answer")
            if answer is not None and (not isinstance(answer, str) or not answer.strip()):
                raise ValueError("answer must be a non-empty string")
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{i}: expected {{\"prompt\": str, \"answer\"?: str}} ({e})") from None
        out.append(GeneralPrompt(str(obj.get("id", f"{source}-{i}")), str(obj.get("kind", "user")), prompt,
                                 answer))
    return out


def _spread(prompts: list[GeneralPrompt], n: int) -> list[GeneralPrompt]:
    """`n` prompts taken round-robin over the kinds (the file's order within a kind): a small guard still
    covers facts, arithmetic, instructions and code."""
    by_kind: dict[str, list[GeneralPrompt]] = {}
    for p in prompts:
        by_kind.setdefault(p.kind, []).append(p)
    out: list[GeneralPrompt] = []
    while len(out) < min(n, len(prompts)):
        for group in by_kind.values():
            if group and len(out) < n:
                out.append(group.pop(0))
    return out


def general_prompts(n_builtin: int, user_file: str | Path | None = None) -> list[GeneralPrompt]:
    """`n_builtin` of the built-in guard prompts plus every prompt of `user_file` (if given)."""
    builtin = _read(GENERAL_DIR / "guard_prompts.jsonl", "builtin")
    if n_builtin > len(builtin):
        raise ValueError(f"finetune.guard_prompts: the built-in set has {len(builtin)} prompts, asked {n_builtin}")
    own = _read(Path(user_file), "user") if user_file else []
    if user_file and not own:
        raise ValueError(f"{user_file}: no prompts")
    return _spread(builtin, n_builtin) + own


def replay_prompts(n: int) -> list[GeneralPrompt]:
    pool = _read(GENERAL_DIR / "replay_prompts.jsonl", "replay")
    if n > len(pool):
        raise ValueError(f"finetune.replay: at most {len(pool)} replay conversations (the built-in pool), asked {n}")
    return _spread(pool, n)


def _chat_ids(tokenizer: Any, formatter: Any, prompt: str) -> list[int]:
    return encode_chat(tokenizer, formatter.render([{"role": "user", "content": prompt}]))


def record(llm: Any, formatter: Any, prompts: Sequence[GeneralPrompt], max_tokens: int) -> Recorded:
    """Greedy answers of `llm` (an infer.LLM) to `prompts`, each rendered with the chat template as served."""
    prompts = list(prompts)
    if not prompts:
        return Recorded([], [], [], [])
    ids = [_chat_ids(llm.tokenizer, formatter, p.prompt) for p in prompts]
    outs = llm.generate(ids, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    return Recorded(prompts, [o.text for o in outs], [list(o.token_ids) for o in outs],
                    [o.finish_reason == "stop" for o in outs])


def answer_nll(model: Any, tokenizer: Any, formatter: Any, rec: Recorded, device: str = "cpu",
               batch_size: int = 8) -> float:
    """Mean nats per token of the recorded answers (their own token ids) following their chat prompts: padded
    batches, longest first, scored by eval.scoring.score_batches (the head only on the answers' tokens)."""
    rows = [(_chat_ids(tokenizer, formatter, p.prompt), ids) for p, ids in zip(rec.prompts, rec.token_ids) if ids]
    if not rows:
        return 0.0
    T = context_len(model)
    seqs = sorted((([*c, *a][-(T + 1):], len(a)) for c, a in rows), key=lambda s: -len(s[0]))
    batches = []
    for start in range(0, len(seqs), batch_size):
        group = seqs[start:start + batch_size]
        width = max(len(s) for s, _ in group) - 1
        x = np.zeros((len(group), width), dtype=np.int64)
        y = np.full((len(group), width), IGNORE_INDEX, dtype=np.int64)
        for i, (s, n) in enumerate(group):
            x[i, :len(s) - 1] = s[:-1]
            y[i, len(s) - 1 - n:len(s) - 1] = s[len(s) - n:]
        batches.append((x, y))
    return score_batches(model, batches, device=device).loss


def answered(text: str, expected: str) -> bool:
    """`expected` appears in `text` as a whole word (case-insensitive)."""
    return re.search(rf"(?<!\w){re.escape(expected.strip())}(?!\w)", text, re.IGNORECASE) is not None


def retention(base: Recorded, tuned_texts: Sequence[str], base_nll: float, tuned_nll: float, *,
              max_retention_nll: float, min_fact_retention: float) -> dict[str, Any]:
    """The guard's scores and verdict; `tuned_texts` answer the prompts of `base` that carry an answer, in
    order (see factual())."""
    facts = factual(base)
    known = [i for i, (p, t) in enumerate(facts) if answered(t, p.answer)]
    kept = [i for i in known if answered(tuned_texts[i], facts[i][0].answer)]
    fact_retention = len(kept) / len(known) if known else 1.0
    increase = tuned_nll - base_nll
    reasons = []
    if increase > max_retention_nll:
        reasons.append(f"the base's answers became {increase:.2f} nats/token less likely "
                       f"(finetune.max_retention_nll {max_retention_nll})")
    if fact_retention < min_fact_retention:
        reasons.append(f"{len(known) - len(kept)} of the {len(known)} factual prompts the base answered right "
                       f"are now wrong (retention {fact_retention:.0%} < finetune.min_fact_retention "
                       f"{min_fact_retention:.0%})")
    lost = [facts[i][0].id for i in known if i not in kept]
    return {"prompts": len(base.prompts), "base_nll": base_nll, "tuned_nll": tuned_nll, "nll_increase": increase,
            "facts": len(facts), "facts_base_right": len(known), "facts_kept": len(kept),
            "fact_retention": fact_retention, "lost": lost, "passed": not reasons, "reasons": reasons}


def factual(rec: Recorded) -> list[tuple[GeneralPrompt, str]]:
    """(prompt, base answer) for the prompts that carry an expected answer."""
    return [(p, t) for p, t in zip(rec.prompts, rec.texts) if p.answer]
