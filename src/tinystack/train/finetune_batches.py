"""Conversations -> token ids with a loss mask on the assistant tokens -> padded training batches.

Tokenizing (`encode_conversation`): the whole conversation F = render(messages) is encoded
with `infer.chat.encode_chat`, the call the server makes on a chat prompt. For each
assistant turn i (but those with weight 0: context only), with P_i = render(messages[:i],
add_generation_prompt=True) (exactly the prompt the server would build before that turn)
and E_i = render(messages[:i+1]):

    ids(F) = ids(P_i) + [assistant tokens of turn i] + ...     loss on those tokens only
             (the content and the template's end of turn, e.g. <|im_end|>: the model learns to stop)

A conversation whose tokens do not split this way (a template that does not render turn by
turn, or a BPE merge across a turn boundary) is rejected as unstable_tokenization rather than
trained on prompts the server would never send. When the last turn carries no EOS token
(templates without one, or the built-in role format), EOS is appended as its final target.
Conversations longer than max_len tokens are rejected as too_long (cut, they would teach
the model to stop mid-answer or not at all).

Batching (`ConversationBatches`): each epoch a seeded permutation of the conversations; a
global batch of n is the next n of it, right-padded to the longest. Right padding needs no
attention mask: causal attention never lets a real token see the padding after it, and
padded targets are IGNORE_INDEX. Its state (generator, epoch order, position) is the data
position checkpoints keep.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tinystack.infer.chat import ChatFormatter, encode_chat
from tinystack.train.finetune_data import is_target
from tinystack.train.loss import IGNORE_INDEX


@dataclass
class Example:
    ids: np.ndarray  # int64 [L]: the conversation's tokens
    target: np.ndarray  # bool [L]: token t is an assistant token (predicted from t - 1, so target[0] is False)

    def xy(self) -> tuple[np.ndarray, np.ndarray]:
        """Inputs ids[:-1] and next-token targets, IGNORE_INDEX where the next token is not the assistant's."""
        return self.ids[:-1], np.where(self.target[1:], self.ids[1:], IGNORE_INDEX)

    @property
    def n_targets(self) -> int:
        return int(self.target.sum())


def encode_conversation(messages: Sequence[dict[str, str]], formatter: ChatFormatter, tokenizer: Any,
                        max_len: int) -> Example | str:
    """The Example of one conversation, or the reject reason (unstable_tokenization, too_long)."""
    ids = encode_chat(tokenizer, formatter.render(list(messages), add_generation_prompt=False))
    target = np.zeros(len(ids), dtype=bool)
    span = (0, 0)  # the last assistant turn's tokens
    for i, m in enumerate(messages):
        if not is_target(m):  # user, system, or an assistant turn with weight 0: context only
            continue
        prompt = encode_chat(tokenizer, formatter.render(list(messages[:i]), add_generation_prompt=True))
        upto = encode_chat(tokenizer, formatter.render(list(messages[:i + 1]), add_generation_prompt=False))
        if ids[:len(prompt)] != prompt or ids[:len(upto)] != upto or len(upto) <= len(prompt):
            return "unstable_tokenization"
        span = (len(prompt), len(upto))
        target[span[0]:span[1]] = True
    eos = tokenizer.eos_token_id
    if eos is not None and span[1] == len(ids) and eos not in ids[span[0]:span[1]]:
        ids, target = [*ids, eos], np.append(target, True)  # the final answer must end in a stop
    if len(ids) > max_len:
        return "too_long"
    return Example(np.asarray(ids, dtype=np.int64), target)


def pad_batch(examples: Sequence[Example], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """x, y int64 [n, longest - 1], right-padded (x with pad_id, y with IGNORE_INDEX)."""
    width = max(len(e.ids) for e in examples) - 1
    x = np.full((len(examples), width), pad_id, dtype=np.int64)
    y = np.full((len(examples), width), IGNORE_INDEX, dtype=np.int64)
    for i, e in enumerate(examples):
        xi, yi = e.xy()
        x[i, :len(xi)], y[i, :len(yi)] = xi, yi
    return x, y


def fixed_batches(examples: Sequence[Example], batch_size: int, pad_id: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Evaluation batches: every example once, longest first (little padding), the same every call."""
    order = sorted(range(len(examples)), key=lambda i: -len(examples[i].ids))
    return [pad_batch([examples[i] for i in order[s:s + batch_size]], pad_id)
            for s in range(0, len(order), batch_size)]


class ConversationBatches:
    """A `loop.BatchSource` over Examples: seeded epoch permutations, padded global batches."""

    def __init__(self, examples: Sequence[Example], seed: int, pad_id: int) -> None:
        if not examples:
            raise ValueError("no training conversations")
        self.examples, self.pad_id = list(examples), pad_id
        self.gen = torch.Generator().manual_seed(seed)
        self.order: list[int] = []
        self.pos = 0
        self.epoch = 0

    def _next(self) -> Example:
        if self.pos >= len(self.order):
            self.order = torch.randperm(len(self.examples), generator=self.gen).tolist()
            self.pos, self.epoch = 0, self.epoch + 1
        self.pos += 1
        return self.examples[self.order[self.pos - 1]]

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        return pad_batch([self._next() for _ in range(n)], self.pad_id)

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.gen.get_state(), "order": list(self.order), "pos": self.pos, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.gen.set_state(state["generator"])
        self.order, self.pos, self.epoch = list(state["order"]), int(state["pos"]), int(state["epoch"])
