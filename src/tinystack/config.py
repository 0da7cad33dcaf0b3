"""One typed configuration for the whole pipeline.

A config is a tree of dataclasses, one section per layer. It is loaded from a TOML
file whose tables mirror the sections (``[data]``, ``[train]``, ...) and can be
overridden from the command line with dotted ``section.key=value`` strings.
Unknown sections or keys are an error (a typo must never be silently ignored), and
every value is checked against the field's declared type.
"""
from __future__ import annotations

import dataclasses
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


class ConfigError(ValueError):
    """A config file or override is malformed; the message says where and why."""


@dataclass
class DataConfig:
    inputs: list[str] = field(default_factory=list)  # JSONL files / text folders; empty = built-in corpus
    corpus_max_docs: int = 0  # cap on built-in corpus records (0 = all)
    min_chars: int = 32  # length filter, after normalisation
    max_chars: int = 20_000
    split_by: str = "source"  # "source" | "time"
    val_fraction: float = 0.05  # share of records, whole sources at a time (split_by=source)
    test_fraction: float = 0.05
    val_from: str = ""  # ISO timestamps (split_by=time): [val_from, test_from) -> val, >= test_from -> test
    test_from: str = ""


@dataclass
class TokenizerConfig:
    vocab_size: int = 2048
    max_train_chars: int = 2_000_000  # BPE is trained on at most this much of the train split


@dataclass
class ModelConfig:
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 128  # max sequence length (n_positions)
    dropout: float = 0.0


@dataclass
class TrainConfig:
    max_iters: int = 1500
    batch_size: int = 16
    learning_rate: float = 3e-3
    min_lr: float = 3e-4
    warmup_iters: int = 50
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0
    eval_interval: int = 250
    eval_iters: int = 20
    seed: int = 1337


@dataclass
class EvalConfig:
    max_windows: int = 256  # deterministic non-overlapping windows per split (0 = all)
    batch_size: int = 16


@dataclass
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    max_concurrency: int = 4  # requests generating at once; the rest wait on a semaphore
    timeout_s: float = 30.0
    max_prompt_chars: int = 8_000
    max_tokens_limit: int = 512


@dataclass
class RunConfig:
    workdir: str = ""  # default: runs/<timestamp>
    device: str = "cpu"
    demo_prompts: list[str] = field(
        default_factory=lambda: [
            "Return the number of",
            "This module provides",
            "Raise ValueError if",
            "The default value is",
        ]
    )
    demo_max_tokens: int = 40
    demo_port: int = 0  # 0 = pick a free port


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _coerce(value: Any, typ: Any, where: str) -> Any:
    """Check (and for ints -> floats, widen) a value against a dataclass field type."""
    origin = typing.get_origin(typ)
    if origin is list:
        (item,) = typing.get_args(typ)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typ is int and isinstance(value, bool) or not isinstance(value, typ):
        raise ConfigError(f"{where}: expected {typ.__name__}, got {value!r}")
    return value


def _apply(cfg: Config, section: str, key: str, value: Any, where: str) -> None:
    sec = getattr(cfg, section, None)
    if sec is None or not dataclasses.is_dataclass(sec):
        known = ", ".join(f.name for f in dataclasses.fields(cfg))
        raise ConfigError(f"{where}: unknown section [{section}] (known: {known})")
    hints = typing.get_type_hints(type(sec))
    if key not in hints:
        known = ", ".join(f.name for f in dataclasses.fields(sec))
        raise ConfigError(f"{where}: unknown key {section}.{key} (known: {known})")
    setattr(sec, key, _coerce(value, hints[key], f"{where}: {section}.{key}"))


def _parse_override_value(text: str) -> Any:
    """`3` -> 3, `0.5` -> 0.5, `true` -> True, `["a"]` -> list; anything else stays a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults, then the TOML file (if any), then `section.key=value` overrides, in that order."""
    cfg = Config()
    if path is not None:
        path = Path(path)
        try:
            doc = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: invalid TOML: {e}") from None
        for section, table in doc.items():
            if not isinstance(table, dict):
                raise ConfigError(f"{path}: top-level key {section!r} must be a [table]")
            for key, value in table.items():
                _apply(cfg, section, key, value, str(path))
    for item in overrides or []:
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise ConfigError(f"override {item!r}: expected section.key=value")
        dotted, raw = item.split("=", 1)
        section, key = dotted.strip().split(".", 1)
        _apply(cfg, section, key, _parse_override_value(raw.strip()), f"override {item!r}")
    return cfg
