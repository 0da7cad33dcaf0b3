"""weight_format="auto": measure every weight format on this machine for this model, keep the fastest accurate one.

    choose_format(model, model_dir, tokenizer) -> Choice   (.format: "fp32" | "bf16" | "q8_0" | "q4_0" | "q4_1")

For each candidate the model is copied and quantised (linear.quantize_model), then
  speed    one batch-1 decode pass over its linear layers (the matmuls that dominate decode),
           REPEATS rounds with the candidates interleaved, median wall time
  quality  perplexity (nn.nll.token_nll, what every score sums) on a fixed built-in text
           (calibration.txt, up to MAX_TOKENS tokens of it)
           against float32's, computed with decode's arithmetic (kernels.decode_arithmetic: int8
           activations, not prefill's float GEMM), and top-1 agreement: the share of positions where
           the candidate's most likely next token is float32's (teacher-forced greedy agreement)
The fastest candidate whose perplexity is within PPL_BOUNDS of float32's, above or below, wins (float32
itself always qualifies). No format is preferred by a rule: the choice follows from the measurements,
so a machine with other caches, bandwidth or instructions may choose differently. Timings taken while
other programs load the machine are noisy; delete the cache file, or name a `weight_format`
explicitly, to override a decision.
The decision is cached in ~/.cache/tinystack/weight_formats.json (the directory is `CACHE_DIR`),
keyed by the model's fingerprint, the CPU (model name, family/model/stepping, flags, core
count) and the torch version, so later loads on the same machine reuse it and another machine
measures again.
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn

from tinystack.atomic import read_json, write_json
from tinystack.infer.quant import kernels
from tinystack.infer.quant.formats import FORMATS
from tinystack.infer.quant.linear import QuantLinear, quantize_model
from tinystack.kernels import cpu
from tinystack.nn.nll import token_nll

CANDIDATES = ("fp32",) + FORMATS
PPL_BOUNDS = {"fp32": 0.0, "bf16": 0.01, "q8_0": 0.01, "q4_0": 0.05, "q4_1": 0.05}  # relative perplexity change
MAX_TOKENS = 256
REPEATS = 7
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tinystack"
_CACHE_FILE = "weight_formats.json"
_VERSION = 3  # bump when the measurement changes meaning: old decisions are then re-measured
CALIBRATION_TEXT = Path(__file__).with_name("calibration.txt")


@dataclass
class Choice:
    format: str  # "fp32" or one of formats.FORMATS
    ms: dict[str, float]  # median ms of one batch-1 pass over the linear layers
    ppl: dict[str, float]
    agreement: dict[str, float]  # top-1 agreement with float32
    tokens: int
    cached: bool = False

    @property
    def quantize(self) -> str | None:
        return None if self.format == "fp32" else self.format

    def summary(self) -> str:
        base = self.ppl["fp32"]
        parts = [f"{f} {self.ms[f]:.3g} ms" + (f" ppl {self.ppl[f] / base - 1:+.1%} top1 {self.agreement[f]:.0%}"
                                                if f in self.ppl else " (slower than the choice: not scored)")
                 for f in sorted(self.ms, key=self.ms.__getitem__)]
        how = "cached decision" if self.cached else "measured"
        return (f"weight_format=auto -> {self.format}: fastest within perplexity bounds ({how}; decode matmuls at "
                f"batch 1 / perplexity vs fp32 / top-1 agreement over {self.tokens} tokens: {'; '.join(parts)})")


def model_fingerprint(model_dir: str | Path) -> str:
    """config.json's bytes, and each weight file's size, first and last MiB: a changed checkpoint changes these
    (hashing every byte would cost seconds per load for a few-hundred-MB model)."""
    d = Path(model_dir)
    h = hashlib.sha256((d / "config.json").read_bytes() if (d / "config.json").is_file() else b"")
    for f in sorted(d.glob("*.safetensors")):
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(1 << 20))
            fh.seek(max(0, size - (1 << 20)))
            h.update(fh.read(1 << 20))
    return h.hexdigest()[:16]


def _cache_key(model_dir: str | Path) -> tuple[str, dict[str, str]]:
    ident = {"model": model_fingerprint(model_dir), "cpu": cpu.identity(), "torch": torch.__version__,
             "version": str(_VERSION)}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16], ident


def _linear_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, (nn.Linear, QuantLinear))]


def _time_decode_passes(models: dict[str, nn.Module]) -> dict[str, float]:
    layers = {f: _linear_layers(m) for f, m in models.items()}
    xs = {k: torch.randn(1, k, generator=torch.Generator().manual_seed(k))
          for k in {layer.in_features for ls in layers.values() for layer in ls}}

    def one_pass(ls):
        for layer in ls:
            layer(xs[layer.in_features])

    times: dict[str, list[float]] = {f: [] for f in layers}
    for ls in layers.values():  # warm-up: kernels built, caches touched
        one_pass(ls)
    for _ in range(REPEATS):
        for f, ls in layers.items():
            t0 = time.perf_counter()
            one_pass(ls)
            times[f].append(time.perf_counter() - t0)
    return {f: statistics.median(t) * 1e3 for f, t in times.items()}


def _quality(model: nn.Module, ids: torch.Tensor) -> tuple[float, torch.Tensor]:
    with kernels.decode_arithmetic():  # the kernels decode runs (int8 activations), not prefill's float GEMM
        logits = model(ids[None])[0][0].float()
    nll = token_nll(logits[:-1], ids[1:])  # the per-token loss every score sums (eval.scoring's too)
    return math.exp(nll.double().mean().item()), logits[:-1].argmax(-1)


def calibration_ids(tokenizer, max_len: int) -> torch.Tensor:
    ids = tokenizer.encode_ordinary(CALIBRATION_TEXT.read_text(encoding="utf-8"))
    return torch.tensor(ids[:min(MAX_TOKENS, max_len)])


def pick(ms: dict[str, float], ppl: dict[str, float]) -> str:
    """The fastest format whose perplexity is within its bound of float32's, either way (float32 always is).
    Lower counts too: a quantised model far *better* on the calibration text than its float32 self is another
    model (e.g. a fine-tune of a model born quantised, rounded back toward its base's grid: it answers as the
    base did, the fine-tuned facts gone)."""
    ok = [f for f in ms if f in ppl and abs(ppl[f] / ppl["fp32"] - 1) <= PPL_BOUNDS[f]]
    return min(ok, key=ms.__getitem__)


@torch.inference_mode()
def measure(model: nn.Module, ids: torch.Tensor, candidates=CANDIDATES, score_all: bool = False) -> Choice:
    """Quantise copies of `model` to each candidate and time them; then score them from the fastest down,
    stopping at the first within bounds unless `score_all`. The float32 model is left as it is."""
    shared = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    models = {"fp32": model}
    for fmt in candidates:
        if fmt != "fp32":  # a copy of the module tree sharing the float tensors, then quantised
            models[fmt] = copy.deepcopy(model, memo=dict(shared))
            quantize_model(models[fmt], fmt)
    ms = _time_decode_passes(models)
    ref_ppl, ref_top = _quality(model, ids)
    ppl, agreement = {"fp32": ref_ppl}, {"fp32": 1.0}
    for fmt in sorted(models, key=ms.__getitem__):  # fastest first
        if not score_all and (fmt == "fp32" or pick(ms, ppl) != "fp32"):
            break  # the rest are slower than float32, or than a candidate that already qualified
        if fmt == "fp32":
            continue
        ppl[fmt], top = _quality(models[fmt], ids)
        agreement[fmt] = (top == ref_top).float().mean().item()
    return Choice(pick(ms, ppl), ms, ppl, agreement, len(ids))


def choose_format(model: nn.Module, model_dir: str | Path, tokenizer, cache_dir: Path | None = None,
                  log=lambda line: print(line, file=sys.stderr)) -> Choice:
    """The cached decision for (this model, this CPU, this torch), else a fresh measurement (then cached).
    Prints one line saying what was chosen and why."""
    path = Path(cache_dir or CACHE_DIR) / _CACHE_FILE
    key, ident = _cache_key(model_dir)
    try:
        cache = read_json(path) if path.is_file() else {}
    except (OSError, ValueError):
        cache = {}  # unreadable: measure again and rewrite it
    if key in cache:
        rec = cache[key]["choice"]
        choice = Choice(**{**rec, "cached": True})
    else:
        max_len = getattr(model.config, "max_seq_len", None) or getattr(model.config, "block_size", MAX_TOKENS)
        choice = measure(model, calibration_ids(tokenizer, max_len))
        cache[key] = {**ident, "model_dir": str(model_dir), "choice": {**asdict(choice), "cached": False}}
        try:
            write_json(path, cache)
        except OSError as e:  # a read-only home still gets the right format, only measured again next time
            log(f"weight_format=auto: could not cache the decision in {path} ({e})")
    log(choice.summary())
    return choice
