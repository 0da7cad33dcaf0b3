"""A model directory's sampling defaults, from its `generation_config.json` (as vLLM reads it by default).

    sampling_defaults(model_dir) -> {"temperature": 0.6, "top_p": 0.9, ...}

Model authors put the sampling their model was tuned for there (Llama 3 Instruct: temperature 0.6, top_p
0.9; Qwen2.5 Instruct: temperature 0.7, top_p 0.8, top_k 20, repetition_penalty 1.05). The server gives them
to a request that omits the field (`[serve] model_sampling_defaults`); a field the request sets wins.
Read: the sampling parameters SamplingParams marks `model_default` (infer/sampler.py's KNOBS: temperature,
top_p, top_k, min_p, repetition_penalty), checked against the same ranges as every request. `do_sample` is
not read (vLLM does not either: a temperature of 0 is how a request, or a model, asks for greedy). A value
of the wrong type or out of range is a one-line ValueError naming the file and the field, never a silently
different sampler.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tinystack.sampling_params import KNOBS

FILE = "generation_config.json"


def sampling_defaults(model_dir: str | Path | None) -> dict[str, Any]:
    """The sampling fields `model_dir`'s generation_config.json sets ({} when it has none), as SamplingParams
    holds them (top_k's -1 is 0)."""
    if model_dir is None or not (path := Path(model_dir) / FILE).is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read it: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object")
    out: dict[str, Any] = {}
    for name, knob in KNOBS.items():
        if knob.model_default and config.get(name) is not None:
            try:
                out[name] = knob.check(config[name])
            except ValueError as e:
                raise ValueError(f"{path}: {e}") from None
    return out
