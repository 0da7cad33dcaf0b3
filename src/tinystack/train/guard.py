"""The forgetting guard and replay around a fine-tune (the scores: eval/retention.py).

    ForgettingGuard.record(base_dir, tokenizer, formatter, ft, max_len, device)
        before training: the base model's greedy answers (float32, the precision fine-tuning trains in) to the
        guard's general prompts and to finetune.replay other ones, and the base's own mean nats per token on
        its guard answers; None when there is nothing to record (guard_prompts 0, no guard_file, replay 0)
    guard.replay_conversations()    [user prompt, the base's answer] conversations to mix into training
                                    (self-distillation); only answers the base finished within half of
                                    max_len (a training conversation's token limit)
    guard.check(model)              after training, on the merged model in memory: eval.retention's scores
                                    and verdict against finetune.max_retention_nll / min_fact_retention

ForgettingError is what `tinystack finetune` ends with when the verdict fails and finetune.allow_forgetting is
off: one line, exit status 2, the model written but marked rejected in its lineage (never promotable).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tinystack.config import FinetuneConfig
from tinystack.errors import UserError
from tinystack.eval.retention import (
    Recorded,
    answer_nll,
    factual,
    general_prompts,
    record,
    replay_prompts,
    retention,
)
from tinystack.infer import LLM
from tinystack.model.io import load_model


def _engine(model: torch.nn.Module, tokenizer: Any, device: str) -> LLM:
    """A float32 engine for ~100 short chats: its memory limit is the weights and a few hundred MiB of KV
    cache, not the machine's memory share (infer.memory_limit_mb 0), which would be prefaulted first."""
    weights_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    return LLM(model, tokenizer, device=device, weight_format="float32", memory_limit_mb=int(weights_mb * 1.5) + 768)


class ForgettingError(UserError, RuntimeError):
    """The fine-tuned model failed the forgetting guard (the message says which score and by how much)."""


class ForgettingGuard:
    def __init__(self, guard: Recorded, replay: Recorded, base_nll: float, tokenizer: Any, formatter: Any,
                 ft: FinetuneConfig, device: str) -> None:
        self.guard, self.replay, self.base_nll = guard, replay, base_nll
        self.tokenizer, self.formatter, self.ft, self.device = tokenizer, formatter, ft, device

    @classmethod
    def record(cls, base_dir: Path, tokenizer: Any, formatter: Any, ft: FinetuneConfig, max_len: int,
               device: str = "cpu") -> ForgettingGuard | None:
        prompts = general_prompts(ft.guard_prompts, ft.guard_file or None)
        replay = replay_prompts(ft.replay)
        if not prompts and not replay:
            return None
        base = load_model(base_dir, device=device).eval()
        llm = _engine(base, tokenizer, device)
        guard = record(llm, formatter, prompts, ft.guard_max_tokens)
        # replayed answers as long as half a training conversation: most of a chatty model's answers finish
        rest = record(llm, formatter, replay, max(ft.guard_max_tokens, max_len // 2))
        del llm
        base_nll = answer_nll(base, tokenizer, formatter, guard, device)
        return cls(guard, rest, base_nll, tokenizer, formatter, ft, device)

    def replay_conversations(self) -> list[list[dict[str, str]]]:
        return [[{"role": "user", "content": p.prompt}, {"role": "assistant", "content": text}]
                for p, text, done in zip(self.replay.prompts, self.replay.texts, self.replay.finished) if done]

    @torch.no_grad()
    def check(self, model: torch.nn.Module) -> dict[str, Any] | None:
        if not self.guard.prompts:
            return None
        model.eval()
        tuned_nll = answer_nll(model, self.tokenizer, self.formatter, self.guard, self.device)
        facts = [p for p, _ in factual(self.guard)]
        llm = _engine(model, self.tokenizer, self.device)
        tuned = record(llm, self.formatter, facts, self.ft.guard_max_tokens).texts
        del llm
        return retention(self.guard, tuned, self.base_nll, tuned_nll, max_retention_nll=self.ft.max_retention_nll,
                         min_fact_retention=self.ft.min_fact_retention)
