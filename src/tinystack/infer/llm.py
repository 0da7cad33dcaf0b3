"""`LLM`: the offline, vLLM-shaped entry point.

    llm = LLM("runs/x/model", kv_cache="paged", max_num_seqs=64)      # keywords: [infer] keys (InferConfig)
    outs = llm.generate(["prompt a", "prompt b"], SamplingParams(temperature=0, max_tokens=32))
    outs[0].text, outs[0].token_ids, outs[0].finish_reason, outs[0].logprobs, outs[0].metrics

It loads the model directory (model.io: ours, HF GPT-2, HF Llama family) and its tokenizer
(tinystack.tokenizer.load_tokenizer), keeps the weights in [infer] weight_format (`auto`: the format
measured fastest here, infer.quant), builds an LLMEngine from the same InferConfig and drives it until
every prompt is done. `params` may be one SamplingParams for all prompts or a list, one per prompt.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from tinystack.config import InferConfig
from tinystack.infer.llm_engine import LLMEngine
from tinystack.infer.loading import load_for_inference
from tinystack.infer.outputs import RequestOutput
from tinystack.model.generation_config import sampling_defaults
from tinystack.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str | Path | torch.nn.Module, tokenizer=None, *, device: str = "cpu", draft=None,
                 **config):
        """`model` is a model directory (or an already built model, with `tokenizer`); `config` are [infer] keys
        (InferConfig's fields: weight_format, kv_cache, max_num_seqs, memory_limit_mb, ...), as vLLM's LLM takes
        its engine arguments; `draft` an injected draft model or proposer (speculative="draft")."""
        config = InferConfig(**config)
        model_dir = model if isinstance(model, (str, Path)) else None
        self._model_sampling = sampling_defaults(model_dir)  # {} for a model object; a bad file: before loading
        if model_dir is not None:
            model, tok = load_for_inference(model, config, device, tokenizer=True if tokenizer is None else tokenizer)
            tokenizer = tokenizer or tok
        if tokenizer is None:
            raise ValueError("pass a tokenizer with a model object")
        self.engine = LLMEngine(model, tokenizer, config, draft=draft)
        self.tokenizer = tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model directory's generation_config.json sampling values (vLLM's name);
        what generate() uses when given none."""
        return SamplingParams(**self._model_sampling)

    def generate(self, prompts: str | Sequence[str] | Sequence[list[int]],
                 params: SamplingParams | Sequence[SamplingParams] | None = None,
                 lora: str | Sequence[str | None] | None = None) -> list[RequestOutput]:
        """Run every prompt to completion; outputs in the order of the prompts. No params: the model's
        defaults (get_default_sampling_params). `lora`: a loaded adapter's name (engine.add_lora) for every
        prompt, or one per prompt (None: the base model); rows of different adapters run in the same batches."""
        if isinstance(prompts, str):
            prompts = [prompts]
        params = params or self.get_default_sampling_params()
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(plist)} SamplingParams")
        loras = list(lora) if isinstance(lora, (list, tuple)) else [lora] * len(prompts)
        if len(loras) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(loras)} LoRA names")
        ids = [self.engine.add_request(None, p, sp, a).request_id for p, sp, a in zip(prompts, plist, loras)]
        done: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished():
            for d in self.engine.step(flush=True):
                if d.output is not None:
                    done[d.request_id] = d.output
        return [done[i] for i in ids]
