"""A model directory's sampling defaults, from its `generation_config.json` (as vLLM reads it by default).

    sampling_defaults(model_dir) -> {"temperature": 0.6, "top_p": 0.9, ...}

Model authors put the sampling their model was tuned for there (Llama 3 Instruct: temperature 0.6, top_p
0.9; Qwen2.5 Instruct: temperature 0.7, top_p 0.8, top_k 20, repetition_penalty 1.05). The server gives them
to a request that omits the field (`[serve] model_sampling_defaults`); a field the request sets wins.
Read: temperature, top_p, top_k, min_p, repetition_penalty. `do_sample` is not read (vLLM does not either:
a temperature of 0 is how a request, or a model, asks for greedy). A value of the wrong type or out of
range is a one-line ValueError naming the file and the field, never a silently different sampler.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FILE = "generation_config.json"
# field -> (type, low, high, low inclusive): the OpenAI API's own ranges, so a default never fails a request
_RANGES: dict[str, tuple[type, float, float, bool]] = {
    "temperature": (float, 0.0, 2.0, True),
    "top_p": (float, 0.0, 1.0, False),
    "top_k": (int, -1, 1 << 31, True),
    "min_p": (float, 0.0, 1.0, True),
    "repetition_penalty": (float, 0.01, 10.0, True),
}


def sampling_defaults(model_dir: str | Path | None) -> dict[str, Any]:
    """The sampling fields `model_dir`'s generation_config.json sets ({} when it has none)."""
    if model_dir is None or not (path := Path(model_dir) / FILE).is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read it: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object")
    out: dict[str, Any] = {}
    for name, (kind, low, high, low_inclusive) in _RANGES.items():
        value = config.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
            raise ValueError(f"{path}: {name} must be a number{' (whole)' if kind is int else ''}, got {value!r}")
        if not (low <= value if low_inclusive else low < value) or value > high:
            raise ValueError(f"{path}: {name} must be in {'[' if low_inclusive else '('}{low}, {high}], got {value}")
        out[name] = kind(value)
    if out.get("top_k") == -1:  # -1 is off in vLLM's and HF's spelling; 0 in ours
        out["top_k"] = 0
    return out
