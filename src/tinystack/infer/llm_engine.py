"""The engine core: requests in, one scheduled model step at a time, token deltas out.

    add_request -> admission (memory.py) -> Sequence in the scheduler's queue
    step():  scheduler.schedule() -> ModelRunner.run(batch) -> logits of rows whose prompt is done
             -> sample_batch (per-request params and generators) -> append token
             -> finish on EOS / stop_token_ids / stop string / max_tokens -> release blocks
             -> TokenDelta per request that produced something (the last one carries the RequestOutput)
    With speculative decoding on (speculative.py), decode rows also feed draft tokens in the same model
    call, and append every accepted one plus the target's next token.
    A constrained request (params.structured_outputs, infer/structured) has a Matcher: its row's logits are
    masked (the masks computed while the forward runs), each token it appends advances the matcher, and the
    tokens the grammar then forces are appended unsampled (fed as a chunk by the next step).
    abort(request_id) frees everything the request held, at once.

The scheduler is a policy ("continuous" or "dynamic", see scheduler.py / batcher.py) over
the same block manager, KV storage and model runner; the cache is "paged" (small
blocks, prefix caching) or "contiguous" (one max_seq_len block per sequence).
Not thread-safe: one thread drives it (LLM.generate, or AsyncEngine's engine thread).
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import accumulate
from pathlib import Path
from typing import Callable

import torch

from tinystack.config import InferConfig
from tinystack.infer.batcher import DynamicBatcher
from tinystack.infer.block_manager import BlockManager
from tinystack.infer.detokenize import detokenize, make_delta, request_output
from tinystack.infer.lora import AdapterSet
from tinystack.infer.memory import MemoryBudget, plan_memory
from tinystack.infer.model_runner import ModelRunner
from tinystack.infer.outputs import RequestOutput, TokenDelta
from tinystack.infer.paged_cache import KVStorage
from tinystack.infer.sampler import SampleRow, sample_batch
from tinystack.infer.scheduler import Scheduler
from tinystack.infer.sequence import Sequence
from tinystack.infer.speculative import build_speculator
from tinystack.infer.step_stats import EngineCounters, StepRecord
from tinystack.infer.structured import BatchMasker, Matcher, compile_grammar
from tinystack.model.lora_adapter import LoRAAdapter
from tinystack.sampling_params import SamplingParams, is_greedy


class PromptError(ValueError):
    """A prompt the engine can never run; the message says why, with the numbers."""


class PromptTooLongError(PromptError):
    """The prompt leaves no room for a single new token within the model's context."""


class LLMEngine:
    def __init__(self, model: torch.nn.Module, tokenizer, config: InferConfig | None = None, *, draft=None):
        """An engine over `model` with [infer]'s settings (`config`, the section whole; defaults when None).
        `draft`: an injected speculative proposer or draft model (speculative="draft"), instead of loading
        config.draft_model. Nothing is printed: describe() says what was set up."""
        config = config or InferConfig()  # its values were checked when it was built (config.Section)
        self.config = config
        self.model, self.tokenizer = model.eval(), tokenizer
        eos = getattr(tokenizer, "eos_token_ids", None) or {tokenizer.eos_token_id}
        self._eos_ids = frozenset(t for t in eos if t is not None)
        cfg = model.config
        self.max_seq_len = cfg.max_seq_len
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype if param.is_floating_point() else torch.float32
        block_size, prefix_caching = config.kv_block_size, config.enable_prefix_caching
        if config.kv_cache == "contiguous":  # one block per sequence, preallocated to the whole context
            block_size, prefix_caching = self.max_seq_len, False
        self.budget: MemoryBudget = plan_memory(model, config, device=self.device, dtype=self.dtype,
                                                block_size=block_size)
        self.storage = KVStorage(cfg.n_layer, self.budget.num_blocks, block_size, cfg.n_kv_head, cfg.head_dim,
                                 self.dtype, self.device, config.hugepages)
        self.block_manager = BlockManager(self.budget.num_blocks, block_size, prefix_caching)
        self.scheduler: Scheduler = (
            DynamicBatcher(self.block_manager, config.max_num_seqs, config.max_wait_s)
            if config.scheduler == "dynamic"
            else Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens))
        self.runner = ModelRunner(model, self.storage, self.device, config.hugepages)
        self.speculator = build_speculator(config, block_manager=self.block_manager, draft=draft, target=self.model,
                                           tokenizer=tokenizer, token_slots=self.budget.num_blocks * block_size)
        self.masker: BatchMasker | None = None  # made by the first constrained request
        self.stream_text = False  # True: step() decodes each delta's text as it goes (AsyncEngine, generate)
        self._seqs: dict[str, Sequence] = {}
        self._counter = 0
        self.counters = EngineCounters()
        self.step_listeners: list[Callable[[StepRecord], None]] = []
        self.loras: AdapterSet | None = None  # LoRA adapters, made by the first add_lora

    def describe(self) -> str:
        """What start-up set up, a line each: the memory budget, the weight arena, the draft model's cache.
        Callers that report it (serve, generate) print it on stderr: stdout may be generated text."""
        draft = getattr(self.speculator, "proposer", None)
        parts = [self.budget.describe(), self.runner.arena, getattr(draft, "describe", lambda: None)()]
        return "\n".join(str(p) for p in parts if p is not None)

    def wait_for_kv_pages(self) -> None:
        """Block until the KV storages' first pages are faulted in (paged_cache.KVStorage.prefault, a thread that
        starts with the engine). A server waits for this before it takes requests: a request that came sooner
        would wait for the same pages itself."""
        draft = getattr(self.speculator, "proposer", None)
        for storage in (self.storage, getattr(draft, "storage", None)):
            if storage is not None and storage.prefault is not None:
                storage.prefault.join()

    # -- requests --
    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        """The ids the engine runs for `prompt` (text, or ids already): the one home of the prompt rules.

        Text is tokenised with special-token text kept as text; an empty prompt starts from
        EOS (the document separator, as in training); a prompt must leave room for one new
        token in the context, else PromptTooLongError. Serving, evaluation and the CLI all
        reach these rules through the engine. Safe from any thread (touches no engine state)."""
        ids = list(prompt) if isinstance(prompt, list) else self.tokenizer.encode_ordinary(prompt)
        if not ids:
            if self.tokenizer.eos_token_id is None:
                raise PromptError("the prompt is empty and the tokenizer has no EOS token to start from")
            ids = [self.tokenizer.eos_token_id]
        if len(ids) >= self.max_seq_len:
            raise PromptTooLongError(f"prompt is {len(ids)} tokens; the model's context is {self.max_seq_len} "
                                     f"tokens, so a prompt may be at most {self.max_seq_len - 1} tokens")
        return ids

    def make_sequence(self, request_id: str | None, prompt: str | list[int], params: SamplingParams,
                      lora: str | None = None) -> Sequence:
        """Tokenise and check a request without touching engine state (safe from another thread).

        Raises PromptError (see encode_prompt), AdmissionError (with the numbers) if it can
        never fit the cache, or ValueError for a logit_bias token outside the vocabulary or a LoRA
        adapter (`lora`, its name) that is not loaded."""
        lora_key = self._lora_key(lora)
        if request_id is None:
            request_id, self._counter = f"req-{self._counter}", self._counter + 1
        ids = self.encode_prompt(prompt)
        if params.logit_bias and (top := params.logit_bias[-1][0]) >= (vocab := self.model.config.vocab_size):
            raise ValueError(f"logit_bias names token {top}; the model's vocabulary has {vocab} tokens")
        max_new = min(params.max_tokens, self.max_seq_len - len(ids))
        self.budget.admit(len(ids), max_new)
        matcher = Matcher(self.compile_constraint(params)) if params.structured_outputs else None
        gen = None
        if not is_greedy(params):
            gen = torch.Generator(device=self.device)
            gen.manual_seed(params.seed if params.seed is not None else int(torch.randint(2**62, ()).item()))
        return Sequence(request_id, prompt if isinstance(prompt, str) else "", ids, params, max_new, gen,
                        matcher=matcher, lora_name=lora, lora_key=lora_key)

    def compile_constraint(self, params: SamplingParams):
        """params.structured_outputs compiled for this engine's tokenizer (cached; GrammarError when it cannot be,
        or takes longer than infer.structured_compile_timeout_s). Safe from any thread: a server calls it off
        its event loop before adding the request."""
        return compile_grammar(params.structured_outputs, self.tokenizer, self.config.structured_compile_timeout_s)

    def enqueue(self, seq: Sequence) -> None:
        if seq.request_id in self._seqs:
            raise ValueError(f"request_id {seq.request_id!r} is already in the engine")
        self._seqs[seq.request_id] = seq
        self.scheduler.add(seq)

    def add_request(self, request_id: str | None, prompt: str | list[int], params: SamplingParams,
                    lora: str | None = None) -> Sequence:
        """Queue a request (see make_sequence for what is refused); `lora`: the name of a loaded adapter."""
        seq = self.make_sequence(request_id, prompt, params, lora)
        self.enqueue(seq)
        return seq

    # -- LoRA adapters (infer/lora.py) --
    def add_lora(self, name: str, adapter: LoRAAdapter | str | Path, replace: bool = False) -> None:
        """Load an adapter (a LoRAAdapter, or a PEFT directory) under `name`: requests that name it run with it,
        batched with every other. ValueError (naming what differs) for one that does not fit this model, or past
        infer.max_loras / max_lora_rank. `replace`: a new version of a loaded one (a registry promotion): requests
        added from now on run with it, the ones running finish with the old, which is freed after them."""
        if self.loras is None:
            if getattr(self.model, "needs_full_sequence", False):
                raise ValueError("LoRA adapters need the torch runtime")
            self.loras = self.runner.loras = AdapterSet(self.model, self.config.max_loras, self.config.max_lora_rank)
        adapter = adapter if isinstance(adapter, LoRAAdapter) else LoRAAdapter.load(adapter)
        if replace and name in self.loras.keys:
            self.loras.replace(name, adapter)
            self._drop_retired()
        else:
            self.loras.add(name, adapter)

    def _drop_retired(self) -> None:
        """Free replaced adapter versions no sequence runs with any more."""
        for key in list(self.loras.retired):
            if not any(s.lora_key == key for s in self._seqs.values()):
                self.loras.drop(key)

    def remove_lora(self, name: str) -> None:
        """Unload an adapter; a ValueError while a request still runs with it (it is never cut short)."""
        if self.loras is None or name not in self.loras.keys:
            raise ValueError(f"no LoRA adapter named {name!r} is loaded")
        if users := [s.request_id for s in self._seqs.values() if s.lora_key == self.loras.keys[name]]:
            raise ValueError(f"LoRA adapter {name!r} is in use by {len(users)} request(s); unload it when they end")
        self.loras.remove(name)

    @property
    def lora_names(self) -> list[str]:
        return list(self.loras.keys) if self.loras is not None else []

    @contextmanager
    def adapter_forward(self, lora: str | None, n_tokens: int) -> Iterator[None]:
        """Around a call of the model's own forward on one sequence of n_tokens without the KV cache (scoring a
        prompt: eval.scoring): adapter `lora`'s deltas added (None: the base). KeyError when it is not loaded."""
        if lora is None:
            yield
            return
        try:
            key = self._lora_key(lora)
        except ValueError as e:
            raise KeyError(str(e)) from None
        with self.loras.rows([key] * n_tokens):
            yield

    def _lora_key(self, name: str | None) -> int:
        if name is None:
            return 0
        if self.loras is None or name not in self.loras.keys:
            loaded = ", ".join(self.lora_names) or "none"
            raise ValueError(f"no LoRA adapter named {name!r} is loaded (loaded: {loaded})")
        return self.loras.keys[name]

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request now and free its blocks; None if it is unknown or already finished."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return None
        self.scheduler.finish(seq, "abort")
        seq.text = self.tokenizer.decode(seq.output_ids) if not seq.params.stop else seq.text
        return request_output(seq)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    @property
    def num_free_blocks(self) -> int:
        return self.block_manager.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.block_manager.num_used_blocks

    @property
    def num_preemptions(self) -> int:
        return self.scheduler.num_preemptions

    @property
    def prefix_cache_hit_tokens(self) -> int:
        return self.block_manager.prefix_hits

    @property
    def prefix_cache_query_tokens(self) -> int:
        return self.block_manager.prefix_queries

    @property
    def spec_proposed_tokens(self) -> int:
        """Speculative draft tokens checked by the target since the engine started (0 when off)."""
        return self.speculator.proposed_tokens if self.speculator else 0

    @property
    def spec_accepted_tokens(self) -> int:
        return self.speculator.accepted_tokens if self.speculator else 0

    # -- one step --
    def step(self, flush: bool = False) -> list[TokenDelta]:
        t0, c0 = time.perf_counter(), time.process_time()
        if self.loras is not None and self.loras.retired:
            self._drop_retired()
        batch = self.scheduler.schedule(flush=flush)
        if not batch:
            return []
        drafts = self.speculator.propose(batch) if self.speculator else None
        masks = self._start_masks(batch, drafts)
        logits = self.runner.run(batch, [d.tokens for d in drafts] if drafts else None)
        # each row's last logits row (a speculating row has 1 + d of them)
        last = [x - 1 for x in accumulate(1 + len(d.tokens) for d in drafts)] if drafts else range(len(batch))
        ready, rows, spec = [], [], []
        prefill = 0
        for i, (seq, n) in enumerate(batch):
            is_decode = n == 1 and seq.num_computed + 1 == seq.num_tokens > len(seq.prompt_ids)
            prefill += 0 if is_decode else n
            seq.num_computed += n
            self.block_manager.commit(seq)
            if drafts and drafts[i].tokens:  # verified against its own 1 + d logits rows, below
                spec.append((i, seq))
            elif seq.num_computed == seq.num_tokens:  # prompt (or recompute) done: this row samples
                ready.append((i, seq))
                rows.append(SampleRow(seq.params, seq.generator, seq.prompt_ids, seq.output_ids, self._eos_ids))
        picked = logits[[last[i] for i, _ in ready]].float()  # rows of their own: masking writes in place
        if masks is not None:  # the constrained rows, in `ready` order (both follow the batch's order)
            picked = self.masker.apply(picked, [j for j, (_, s) in enumerate(ready) if s.matcher], masks)
        tokens, infos = sample_batch(picked, rows) if ready else ([], [])
        now = time.perf_counter()
        fed = [(seq, n + len(drafts[i].tokens)) for i, (seq, n) in enumerate(batch)] if drafts else batch
        self._account(fed, prefill, len(ready) + len(spec), t0, c0, now)
        out = [d for (_, seq), tok, info in zip(ready, tokens, infos) if (d := self._append(seq, [tok], [info], now))]
        for i, seq in spec:  # accepted drafts + one token of the target's, then the cache rolled back past them
            toks, infos = self.speculator.verify(seq, drafts[i], logits[last[i] - len(drafts[i].tokens): last[i] + 1])
            delta = self._append(seq, toks, infos, now)
            self.speculator.rollback(seq, len(toks) - 1)
            if delta:
                out.append(delta)
        return out

    def _start_masks(self, batch: list[tuple[Sequence, int]], drafts):
        """Start computing the masks of the constrained rows that sample this step (on the masker's thread, while
        the forward runs); None when there are none. Constrained rows never draft (speculative.may_speculate)."""
        matchers = [seq.matcher for seq, n in batch if seq.matcher and seq.num_computed + n == seq.num_tokens]
        if not matchers:
            return None
        if self.masker is None:
            self.masker = BatchMasker(self.tokenizer.vocab_size, self.config.max_num_seqs)
        return self.masker.start(matchers)

    def _account(self, batch: list[tuple[Sequence, int]], prefill: int, sampled: int, t0: float, c0: float,
                 now: float) -> None:
        """Share the step's wall and CPU seconds across its sequences by tokens fed (step_stats.py)."""
        rec = StepRecord(len(batch), sum(n for _, n in batch), prefill, now - t0, time.process_time() - c0, now)
        for seq, n in batch:
            seq.metrics.device_s += rec.wall_s * n / rec.num_tokens
            seq.metrics.cpu_s += rec.cpu_s * n / rec.num_tokens
        self.counters.add(rec, sampled)
        for listener in self.step_listeners:
            try:
                listener(rec)
            except Exception:  # metrics must never take the engine down
                pass

    def _append(self, seq: Sequence, toks: list[int], infos: list[dict | None], now: float) -> TokenDelta | None:
        """Append new tokens in order (several after a speculative step), stopping at the first that ends it."""
        p = seq.params
        seq.metrics.first_token = seq.metrics.first_token or now
        seq.metrics.last_token = now
        reason = None
        eos = self._eos_ids
        toks, infos, m = list(toks), list(infos), seq.matcher
        i = 0
        while i < len(toks):  # (a constraint's forced tokens are appended to toks as it goes)
            tok, info = toks[i], infos[i]
            i += 1
            if m is not None and not m.accept(tok):  # never for a masked token; a bug must not pass silently
                raise RuntimeError(f"request {seq.request_id}: token {tok} broke its constraint: {m.error()}")
            if (tok in eos and (m is not None or not p.ignore_eos)) or tok in p.stop_token_ids:
                reason = "stop"  # the stop token itself is not part of the output
                break
            seq.token_ids.append(tok)
            if info is not None:
                seq.logprobs.append(info)
            if p.stop or self.stream_text:
                detokenize(self.tokenizer, seq)
                reason = seq.finish_reason
            if reason is None and len(seq.output_ids) >= seq.max_new_tokens:
                reason = "length"
            if reason is None and m is not None and m.is_stopped():
                reason = "stop"  # the constraint is complete and nothing may follow it
            if reason is not None:
                break
            if m is not None and i == len(toks) and self.config.structured_fast_forward and p.logprobs is None:
                forced = m.forced_tokens()[: seq.max_new_tokens - len(seq.output_ids)]
                toks += forced
                infos += [None] * len(forced)
        if reason is not None:
            self.scheduler.finish(seq, reason)
            self._seqs.pop(seq.request_id, None)
        return make_delta(self.tokenizer, seq, self.stream_text)
