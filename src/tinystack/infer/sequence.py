"""One request's state inside the engine: its tokens, how many are in the KV cache, its blocks.

    WAITING --scheduled--> RUNNING --EOS / stop / max_tokens / abort--> FINISHED
       ^                      |
       +---- preempted -------+   (blocks freed; its prompt + output so far is recomputed later)

`num_computed` counts the tokens whose keys/values are in the cache; a step feeds the
model tokens num_computed..num_computed+n-1. When num_computed reaches len(token_ids)
the step's logits give the next token. `metrics` is the request's one record of timing
points (perf_counter seconds) and cost: RequestOutput.metrics and the server's logs read it.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from tinystack.infer.outputs import RequestMetrics
from tinystack.infer.structured import Matcher
from tinystack.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)  # identity: two requests are never the same sequence
class Sequence:
    request_id: str
    prompt: str
    prompt_ids: list[int]
    params: SamplingParams
    max_new_tokens: int  # params.max_tokens capped by the model's context
    generator: torch.Generator | None = None
    token_ids: list[int] = field(default_factory=list)  # prompt + output
    num_computed: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # hashes of the full blocks registered so far
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    logprobs: list[dict] = field(default_factory=list)
    text: str = ""  # decoded output, cut at a stop string
    streamed: int = 0  # characters of `text` already handed out as deltas
    tokens_streamed: int = 0
    num_cached_prompt_tokens: int = 0  # prefix-cache hits at the first admission
    num_preemptions: int = 0
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(arrival=time.perf_counter()))
    matcher: Matcher | None = None  # params.structured_outputs' state (infer/structured), None when unconstrained
    lora_name: str | None = None  # the LoRA adapter it runs with (infer/lora.py), None: the base model
    lora_key: int = 0  # that adapter's key in the engine's AdapterSet (0: the base)

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_ids):]

    @property
    def cache_salt(self) -> int | None:
        """What its first KV block's hash starts from: an adapter's keys and values are its own (block_manager)."""
        return hash(("lora", self.lora_key)) if self.lora_key else None

    @property
    def max_len(self) -> int:
        return len(self.prompt_ids) + self.max_new_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
