"""One typed configuration for the whole pipeline.

A config is a tree of dataclasses, one section per layer. It is loaded from a TOML
file whose tables mirror the sections (``[data]``, ``[train]``, ...) and can be
overridden from the command line with dotted ``section.key=value`` strings.
Unknown sections or keys are an error (a typo must never be silently ignored), and
every value is checked against the field's declared type; a field with a fixed set of
values is a `Literal[...]` and anything else is rejected with the allowed values named.
Command-line flags generated from these fields (tinystack.cli_options) go through the
same check.
"""
from __future__ import annotations

import dataclasses
import functools
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tinystack.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


class ConfigError(UserError, ValueError):
    """A config file or override is malformed; the message says where and why."""


class Section:
    """A config section: its values are checked against the field types when it is built, whether from a
    file, flags or Python (`InferConfig(weight_format="int3")` is the same one-line error as the file's)."""

    def __post_init__(self) -> None:
        name, hints = _section_info(type(self))
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            setattr(self, f.name, _coerce(getattr(self, f.name), hints[f.name], f"{name}.{f.name}"))


@dataclass
class DataConfig(Section):
    inputs: list[str] = field(default_factory=list)  # JSONL files / text folders; empty = built-in corpus
    corpus_max_docs: int = 0  # cap on built-in corpus records (0 = all)
    min_chars: int = 32  # length filter, after normalisation
    max_chars: int = 20_000
    split_by: Literal["source", "time"] = "source"
    val_fraction: float = 0.05  # share of records, whole sources at a time (split_by=source)
    test_fraction: float = 0.05
    val_from: str = ""  # ISO timestamps (split_by=time): [val_from, test_from) -> val, >= test_from -> test
    test_from: str = ""
    # field mapping for inputs with another schema (JSONL / CSV / Parquet)
    text_field: str = "text"
    source_field: str = "source"
    id_field: str = "id"
    label_field: str = "label"
    timestamp_field: str = "timestamp"
    # quality filters (tinystack.data.filters.quality); perplexity runs only with a reference set
    quality: bool = True
    min_words: int = 3  # CJK characters count as words
    max_words: int = 0  # 0 = no upper bound
    scripts: list[str] = field(default_factory=lambda: ["latin", "cjk"])
    min_script_ratio: float = 0.5  # share of letters in `scripts`
    max_symbol_ratio: float = 0.25
    max_digit_ratio: float = 0.3
    repetition: bool = True  # Gopher duplicate-line / top n-gram rules
    perplexity_reference: list[str] = field(default_factory=list)  # JSONL/text inputs the char LM is trained on
    perplexity_percentile: float = 99.0  # drop above this percentile of held-out reference perplexity
    perplexity_order: int = 5  # n of the character n-gram model
    perplexity_max_chars: int = 5_000_000  # reference text the n-gram model is trained on, at most
    # near dedup (MinHash-LSH) and cross-split leakage
    near_dedup: bool = True
    dedup_threshold: float = 0.85  # Jaccard of character shingles
    num_perm: int = 128
    shingle_k: int = 3
    shingle_unit: Literal["char", "word"] = "char"
    leakage_threshold: float = 0.85  # val/test records this close to train (or test to val) are removed; 0 = off
    workers: int = 1  # processes for signatures
    engine: Literal["local", "ray"] = "local"
    ray_address: str = "local"  # "local" starts Ray here; "auto" joins a running cluster


@dataclass
class TokenizerConfig(Section):
    kind: Literal["bpe", "char"] = "bpe"  # byte-level BPE | one token per character of the train text
    vocab_size: int = 2048  # bpe only
    max_train_chars: int = 2_000_000  # BPE is trained on at most this much of the train split
    position_split: float = 0.0  # > 0: re-split ALL text by position, this last fraction -> val (and test)


@dataclass
class ModelConfig(Section):
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    context_length: int = 128  # max sequence length in tokens (GPT-2's n_positions)
    dropout: float = 0.0


@dataclass
class TrainConfig(Section):
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
    backend: Literal["torch", "numpy"] = "torch"  # numpy: the hand-written backward of tinystack.nn
    # bfloat16: autocast; float16: CUDA + GradScaler; auto: float32 or bf16, whichever a few timed steps show faster
    dtype: Literal["float32", "bfloat16", "float16", "float64", "auto"] = "float32"
    grad_accum_steps: int = 1  # micro-batches of batch_size per optimiser step (per rank)
    compile: bool = False  # torch.compile the model
    ckpt_interval: int = 500  # write last.pt every N steps (and at the end); 0 = only at the end
    early_stopping: int = 0  # stop after this many evaluations in a row without a lower val loss (0 = never)
    keep_best: bool = False  # end with the trainable weights of the lowest val loss, not the last step's
    plot: bool = True  # write a PNG loss curve beside the training log
    # glibc only: freed memory stays in the process for the next step instead of page-faulting back in each step
    # (train/allocator.py); the process keeps its peak memory
    keep_freed_memory: bool = True


@dataclass
class FinetuneConfig(Section):
    """Supervised fine-tuning of a pretrained model directory (tinystack.train.finetune): what only fine-tuning
    has. The steps, optimiser and precision are [train]'s keys (from FINETUNE_DEFAULTS under `tinystack
    finetune`), the held-out share and dedup are [data]'s."""

    max_seq_len: int = 256  # longer conversations are quarantined as too_long (0 = the model's context)
    # > 0: train rank-r adapters on every projection instead of all weights (merged on save); 0 = full
    # fine-tuning, which on a few hundred conversations overwrites what the model knew (docs/train.md)
    lora: int = 16
    lora_alpha: float = 32.0  # adapter scale = lora_alpha / lora
    lora_dropout: float = 0.0
    lora_targets: list[str] = field(default_factory=lambda: [  # linear layers to adapt ("q_proj,v_proj": two)
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "c_attn", "c_proj", "c_fc"])
    epochs: float = 3.0  # passes over the training split when train.max_iters is 0 (the fine-tune default)
    # the forgetting guard (train/guard.py): the base's greedy answers to general prompts, scored after training
    guard_prompts: int = 100  # how many of the built-in general prompts (spread over their kinds; 0 = none)
    guard_file: str = ""  # the user's own general prompts (JSONL: {"prompt", "answer"?}), added to the built-in
    guard_max_tokens: int = 48  # tokens of each recorded base answer
    # a KL-style retention score: the mean over the base answers' tokens of log p_base - log p_tuned
    max_retention_nll: float = 0.5  # how many nats/token less likely the base's own answers may become
    min_fact_retention: float = 0.9  # share of the factual prompts the base answered right that must stay right
    allow_forgetting: bool = False  # write a model past the thresholds as accepted anyway (the report keeps it)
    replay: int = 100  # conversations of the base's own answers to other general prompts mixed into training
    register: str = ""  # add the model to run.registry under this name (current only if its gate passes)


# What `tinystack finetune` starts from (then the file, --set and flags): zeros filled from the data by
# finetune.schedule() (max_iters = finetune.epochs passes, learning rate 2e-3 LoRA / 2e-5 full, min_lr a tenth,
# held-out loss twice an epoch), early stopping, the best weights kept (docs/train.md: why, measured).
FINETUNE_DEFAULTS = {
    "train.max_iters": 0, "train.batch_size": 8, "train.learning_rate": 0.0, "train.min_lr": 0.0,
    "train.warmup_iters": 2, "train.weight_decay": 0.0, "train.eval_interval": 0, "train.ckpt_interval": 0,
    "train.early_stopping": 3, "train.keep_best": True, "data.val_fraction": 0.1,
}


@dataclass
class EvalConfig(Section):
    max_windows: int = 256  # deterministic non-overlapping windows per split (0 = all)
    windows_per_batch: int = 16  # windows scored in one forward pass
    max_docs: int = 1000  # documents per split scored one by one for the slices (evenly spaced; 0 = all)
    length_buckets: list[int] = field(default_factory=lambda: [32, 128, 512])  # bucket edges, in tokens
    worst_k: int = 10  # bad cases listed per split
    near_dup_threshold: float = 0.8  # MinHash Jaccard at which a held-out document counts as leaked
    gen_prompts: list[str] = field(default_factory=list)  # generation checks; empty = run.demo_prompts
    gen_max_tokens: int = 32
    regression_cases: int = 16  # cases `tinystack run` builds from the held-out split
    regression_tolerance: float = 0.02  # nats per target byte a case may worsen before it counts as a regression


@dataclass
class ServeConfig(Section):
    """The HTTP server (tinystack.serve); the engine behind it is built from [infer]."""

    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str = ""  # id in /v1/models and responses; "" = the model directory's name
    max_queued_requests: int = 32  # sequences waiting beyond infer.max_num_seqs; more -> 429 at once
    timeout_s: float = 0.0  # per request (queue + generation); 0: from the measured speed (serve/engine/deadline.py)
    stall_timeout_s: float = 5.0  # no token for this long = the engine stalled
    max_tokens_limit: int = 512
    default_max_tokens: int = 64  # when a request gives none (capped by what fits the context)
    model_sampling_defaults: bool = True  # omitted sampling fields take the model's generation_config.json values
    max_n: int = 8  # choices per request
    embedding_pooling: Literal["last", "mean"] = "last"  # /v1/embeddings: the last token's state, or the mean
    max_body_bytes: int = 1_000_000  # larger request bodies -> 413
    fallback_text: str = ""  # answer marked "degraded" when the engine fails; "" = 503 instead
    breaker_failures: int = 5  # consecutive engine failures that open the circuit (0 = never)
    breaker_cooldown_s: float = 5.0  # open -> half-open after this long
    watchdog_interval_s: float = 1.0  # how often a dead engine loop is looked for (and restarted)
    api_key_env: str = "TINYSTACK_API_KEYS"  # env var with comma-separated keys
    api_key_file: str = ""  # file of hex SHA-256 key hashes, one per line
    open_health: bool = True  # /health, /ready (and /metrics) without a key
    rate_limit_rpm: float = 0.0  # requests per minute per key (0 = off)
    rate_limit_tpm: float = 0.0  # prompt + max tokens per minute per key (0 = off)
    shutdown_grace_s: float = 10.0  # SIGTERM: in-flight requests get this long to finish
    drain_delay_s: float = 0.0  # SIGTERM: keep accepting (with /ready 503) this long first
    lora_modules: list[str] = field(default_factory=list)  # NAME=PATH: PEFT adapters a request's `model` can name
    admin_key_env: str = "TINYSTACK_ADMIN_KEYS"  # keys of the admin routes (LoRA load/unload); none set: they are off
    price_per_device_hour: float = 0.085  # USD per busy device-hour (default ~ a 2-vCPU cloud instance)
    otel_exporter: Literal["", "console", "otlp"] = ""  # OpenTelemetry spans ("" = off; otlp needs the [otel] extra)
    gc_freeze: bool = True  # gc.freeze() at start-up: the loaded model is never traversed by the collector
    loop_lag_interval_s: float = 0.1  # event-loop lag probe period (0 = off)
    log_text: bool = False  # prompts and outputs in the request log (tinystack serve)
    # replicas > 1 or a ray_cluster: Ray Serve replicas behind this server as gateway (serve/replicas; [dist] extra)
    replicas: int = 1  # engine replicas, each its own engine, KV cache and memory budget
    ray_cluster: str = ""  # Ray address: "" = start a local cluster; "auto" = join the one `ray start --head` runs
    routing: Literal["prefix", "least_loaded", "round_robin"] = "prefix"  # how the gateway picks a replica
    prefix_overload: int = 4  # prefix routing passes over a replica loaded by more than this over the least
    replica_num_cpus: float = 1.0  # CPUs Ray reserves for each replica (its torch threads follow)
    redis_url: str = ""  # rate-limit state in Redis (redis://host:port/db), shared by every gateway process


@dataclass
class InferConfig(Section):
    """The inference engine (tinystack.infer), for `generate`, `serve`, `bench serve` and the demo alike:
    `load_for_inference(model_dir, config)` and `LLMEngine(model, tokenizer, config)` read it whole."""

    runtime: Literal["torch", "numpy"] = "torch"  # numpy: the NumPy GPT (tinystack.nn), reference only
    # how the weights are kept: auto (CPU) = the fastest format within perplexity bounds, measured here and cached
    # (infer/quant/auto.py); float32 / bfloat16 = the whole model in that dtype; bf16 / q8_0 / q4_0 / q4_1 = the
    # linear layers' weights in that format (GGUF blocks for q*), float32 activations (infer/quant)
    weight_format: Literal["auto", "float32", "bfloat16", "bf16", "q8_0", "q4_0", "q4_1"] = "auto"
    kv_cache: Literal["paged", "contiguous"] = "paged"  # contiguous: one whole-context block per sequence
    scheduler: Literal["continuous", "dynamic"] = "continuous"  # dynamic: batches run to completion
    kv_block_size: int = 16  # tokens per KV block (paged)
    max_num_seqs: int = 64  # sequences generated at once (dynamic: the batch size; 1 = no batching)
    max_num_batched_tokens: int = 512  # per step: decodes + prefill chunks
    enable_prefix_caching: bool = True
    memory_limit_mb: int = 0  # 0 = GPU free memory on CUDA, cpu_memory_fraction of available RAM on CPU
    memory_buffer: float = 0.2  # share of memory_limit kept free
    cpu_memory_fraction: float = 0.25
    num_kv_blocks: int = 0  # > 0: at most this many KV blocks, whatever the budget allows (tests, benchmarks)
    max_wait_s: float = 0.05  # dynamic: a batch starts when max_num_seqs wait, or the oldest has waited this long
    hugepages: bool = True  # CPU: weights and KV cache in 2 MiB pages (infer/weight_arena.py)
    # decode several tokens a step (infer/speculative.py): drafts from n-grams of the prompt+output or a draft model
    speculative: Literal["off", "prompt_lookup", "draft"] = "off"
    num_speculative_tokens: int = 4  # drafts checked per step and sequence (k)
    draft_model: str = ""  # speculative="draft": a smaller model directory with the same tokenizer
    prompt_lookup_min: int = 1  # prompt_lookup: n-gram sizes matched, longest first
    prompt_lookup_max: int = 3
    max_loras: int = 8  # LoRA adapters resident at once (infer/lora.py: mixed per row in one batch)
    max_lora_rank: int = 64
    structured_compile_timeout_s: float = 5.0  # longer to compile: refused (a 400)
    structured_fast_forward: bool = True  # append the tokens a constraint forces without sampling them


@dataclass
class RunConfig(Section):
    workdir: str = ""  # default: runs/<timestamp>
    device: str = "cpu"
    # 0 = torch's default, fastest on an idle machine; 1 helps when the cores are shared with other jobs
    threads: int = 0  # torch intra-op threads while training and evaluating (docs/train.md)
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
    pretrained: str = "smollm2-135m-instruct"  # imported and served beside the trained model ("" = none)
    chat_questions: list[str] = field(default_factory=lambda: [
        "What is the capital of Japan?",
        "Name three primary colors.",
        "Write a Python function that returns the square of a number.",
    ])
    chat_max_tokens: int = 64
    registry: str = "runs/registry"  # the model registry `tinystack run` gates against and promotes into
    name: str = "tinystack"  # the registry name this pipeline's models are promoted under


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    infer: InferConfig = field(default_factory=InferConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@functools.cache
def _section_info(cls: type) -> tuple[str, dict[str, Any]]:
    """(the section's name in Config, its field types): what Section.__post_init__ checks against."""
    name = next((n for n, t in typing.get_type_hints(Config).items() if t is cls), cls.__name__)
    return name, typing.get_type_hints(cls)


def _coerce(value: Any, typ: Any, where: str) -> Any:
    """Check (and for ints -> floats, widen) a value against a dataclass field type."""
    origin = typing.get_origin(typ)
    if origin is Literal:
        allowed = typing.get_args(typ)
        if isinstance(value, bool) or value not in allowed:
            raise ConfigError(f"{where}: expected one of {', '.join(map(repr, allowed))}, got {value!r}")
        return value
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


# Keys that were renamed or moved (one name per concept): an old name in a file, --set or flag is an error that
# names the new key, never silently ignored.
RENAMED = {
    "model.block_size": "model.context_length",
    "infer.block_size": "infer.kv_block_size",
    "infer.dtype": "infer.weight_format",
    "infer.quantize": "infer.weight_format",
    "infer.backend": "infer.runtime",
    "serve.ray_address": "serve.ray_cluster", "serve.max_prompt_chars": "serve.max_body_bytes",  # prompts: in tokens
    "train.threads": "run.threads",
    "eval.threads": "run.threads",
    "eval.batch_size": "eval.windows_per_batch",
    **{f"finetune.{k}": f"train.{k}" for k in ("max_iters", "batch_size", "grad_accum_steps", "learning_rate", "min_lr",
                                                "warmup_iters", "weight_decay", "eval_interval", "ckpt_interval")},
    "finetune.val_fraction": "data.val_fraction",
}


def _apply(cfg: Config, section: str, key: str, value: Any, where: str) -> None:
    if (new := RENAMED.get(f"{section}.{key}")) is not None:
        raise ConfigError(f"{where}: {section}.{key} is now {new}")
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


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                flags: dict[str, Any] | None = None, defaults: dict[str, Any] | None = None) -> Config:
    """Defaults (the dataclasses', then a command's own `defaults` such as FINETUNE_DEFAULTS), then the TOML
    file (if any), then `section.key=value` overrides, then `flags` ({"section.key": value} from command-line
    flags named --key), in that order."""
    cfg = Config()
    for dotted, value in (defaults or {}).items():
        section, key = dotted.split(".", 1)
        _apply(cfg, section, key, value, "defaults")
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
    for dotted, value in (flags or {}).items():
        section, key = dotted.split(".", 1)
        _apply(cfg, section, key, value, f"--{key.replace('_', '-')}")
    return cfg
