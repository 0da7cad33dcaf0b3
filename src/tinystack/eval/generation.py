"""Generation checks: greedy and sampled continuations, scored for diversity, so a looping model is caught.

    distinct-n        unique n-grams / all n-grams, pooled over the continuations of a
                      setting (Li et al., 2016); low = the model says the same thing everywhere
    repetition rate   per continuation, the share of its n-grams (n = 4 tokens by default)
                      that already occurred earlier in the same continuation ("seq-rep-n",
                      Welleck et al., 2019); 0 = no repeats, near 1 = a loop

`complete` is the only function that calls the inference layer's generation API:
if that API changes, nothing else in evaluation does.
"""
from __future__ import annotations

from typing import Any, Sequence

from tinystack.model.gpt import GPT


def complete(model: GPT, tokenizer: Any, prompt: str, *, max_tokens: int, temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0, seed: int = 0, device: str = "cpu") -> tuple[str, list[int]]:
    """Continue `prompt`; temperature 0 = greedy. Returns (text, token ids) of the continuation only."""
    from tinystack.infer import Engine, SamplingParams

    engine = Engine(model, tokenizer, device=device)
    gen = engine.generate(prompt, SamplingParams(max_tokens=max_tokens, temperature=temperature, top_k=top_k,
                                                 top_p=top_p, seed=seed))
    return gen.text, list(gen.token_ids)


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
    out: dict[str, Any] = {"max_tokens": max_tokens, "loop_threshold": loop_threshold}
    for name, knobs in settings.items():
        rows, seqs = [], []
        for i, prompt in enumerate(prompts):
            text, ids = complete(model, tokenizer, prompt, max_tokens=max_tokens, seed=i, device=device, **knobs)
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
