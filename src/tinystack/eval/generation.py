"""Generation checks: greedy and sampled continuations, scored for diversity, so a looping model is caught.

    distinct-n        unique n-grams / all n-grams, pooled over the continuations of a
                      setting (Li et al., 2016); low = the model says the same thing everywhere
    repetition rate   per continuation, the share of its n-grams (n = 4 tokens by default)
                      that already occurred earlier in the same continuation ("seq-rep-n",
                      Welleck et al., 2019); 0 = no repeats, near 1 = a loop

`complete` is the only function that calls the inference layer's generation API: every
prompt of a call goes to one engine (`LLM`, built once per call) in one batch, with the
tokenizer evaluation loaded, so prompts are tokenized exactly as inference tokenizes them
(the engine applies its own prompt rules: an empty prompt starts from EOS, a prompt
longer than the context raises PromptTooLongError). If that API changes, nothing else
in evaluation does.
"""
from __future__ import annotations

from typing import Any, Sequence

from tinystack.infer import LLM, SamplingParams
from tinystack.model.gpt import GPT


def complete(model: GPT, tokenizer: Any, prompts: Sequence[str | list[int]], params: Any | Sequence[Any], *,
             device: str = "cpu") -> list[tuple[str, list[int]]]:
    """Continue every prompt in one batch on one engine; `params`: one SamplingParams for all or one per
    prompt. Returns (text, token ids) of each continuation, in the order of the prompts."""

    if not prompts:
        return []
    llm = LLM(model.to(device), tokenizer, max_num_seqs=len(prompts))
    return [(o.text, list(o.token_ids)) for o in llm.generate(list(prompts), params)]


def ngrams(ids: Sequence[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]


def distinct_n(sequences: Sequence[Sequence[int]], n: int) -> float:
    """Unique n-grams / total n-grams over all sequences (nan when there are no n-grams)."""
    grams = [g for s in sequences for g in ngrams(s, n)]
    return len(set(grams)) / len(grams) if grams else float("nan")


def repetition_rate(ids: Sequence[int], n: int = 4) -> float:
    """Share of the sequence's n-grams that repeat an earlier n-gram of the same sequence."""
    grams = ngrams(ids, n)
    if not grams:
        return 0.0
    seen: set[tuple[int, ...]] = set()
    repeats = 0
    for g in grams:
        repeats += g in seen
        seen.add(g)
    return repeats / len(grams)


def generation_checks(model: GPT, tokenizer: Any, prompts: Sequence[str], *, max_tokens: int = 32,
                      temperature: float = 0.8, top_k: int = 50, top_p: float = 0.95, loop_threshold: float = 0.5,
                      device: str = "cpu") -> dict[str, Any]:
    """Greedy and seeded sampled continuations of every prompt, with distinct-1/2 and repetition rates.

    A continuation whose repetition rate exceeds `loop_threshold` is flagged as looping.
    """

    settings = {"greedy": {"temperature": 0.0}, "sampled": {"temperature": temperature, "top_k": top_k,
                                                            "top_p": top_p}}
    jobs = [(name, i, prompt) for name in settings for i, prompt in enumerate(prompts)]
    params = [SamplingParams(max_tokens=max_tokens, seed=i, **settings[name]) for name, i, _ in jobs]
    done = complete(model, tokenizer, [p for _, _, p in jobs], params, device=device)  # both settings, one batch
    out: dict[str, Any] = {"max_tokens": max_tokens, "loop_threshold": loop_threshold}
    for name in settings:
        rows, seqs = [], []
        for (setting, _, prompt), (text, ids) in zip(jobs, done):
            if setting != name:
                continue
            rep = repetition_rate(ids)
            rows.append({"prompt": prompt, "completion": text, "tokens": len(ids), "repetition_rate": rep,
                         "looping": rep > loop_threshold})
            seqs.append(ids)
        out[name] = {
            "distinct_1": distinct_n(seqs, 1),
            "distinct_2": distinct_n(seqs, 2),
            "mean_repetition_rate": sum(r["repetition_rate"] for r in rows) / max(len(rows), 1),
            "looping": sum(r["looping"] for r in rows),
            "samples": rows,
        }
    return out
