"""Supervised fine-tuning of a pretrained model directory on conversations (`tinystack finetune`).

    base model dir + conversations JSONL
      -> finetune_data.prepare_conversations    validate (bad lines quarantined with their line number),
                                                render with the model's chat template, dedup, split by source
      -> finetune_batches.encode_conversation   tokens as the server tokenizes the prompt, loss mask on the
                                                assistant tokens (too long / unstable ones quarantined too)
      -> loop.train_model                       the pretraining loop itself: AdamW, warmup + cosine, clipping,
                                                accumulation, bf16, checkpoints and --resume, DDP; the model
                                                factory loads the base and, with lora > 0, injects LoRA
                                                adapters (lora.py) so only they train
      -> lora.merge_lora + checkpoint.save_model_dir   an ordinary model directory (with the base's tokenizer
                                                files and chat template), so inference, serving and
                                                `eval regress` read it like any other
      -> held-out comparison                    mean loss per assistant token on the val split, base vs
                                                fine-tuned, printed and written to report.json

Beside OUT, in OUT_finetune/: train.jsonl and val.jsonl (the prepared conversations),
rejected.jsonl, log.jsonl (+ loss.png), checkpoints/, report.json, and regression.jsonl: chat cases from the
held-out conversations for `tinystack eval regress --model OUT --baseline BASE --cases ...`.
"""
from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path
from typing import Any, Mapping

import torch

from tinystack.atomic import file_sha256, read_json, write_json
from tinystack.config import Config, FinetuneConfig
from tinystack.data.io.records import write_jsonl
from tinystack.data.io.rejects import Rejects
from tinystack.eval.case_sets import build_chat_cases
from tinystack.eval.regression import write_cases
from tinystack.eval.scoring import score_batches
from tinystack.eval.threads import torch_threads
from tinystack.infer.chat import chat_formatter
from tinystack.model.io import load_model, read_lineage
from tinystack.progress import console
from tinystack.tokenizer import load_tokenizer
from tinystack.train.checkpoint import save_model_dir
from tinystack.train.distributed import is_main_process
from tinystack.train.finetune_batches import ConversationBatches, encode_conversation, fixed_batches
from tinystack.train.finetune_data import prepare_conversations
from tinystack.train.loop import train_model
from tinystack.train.lora import inject_lora, merge_lora
from tinystack.train.planned_linear import plan_linears
from tinystack.train.plot import plot_loss_curve
from tinystack.train.precision import autocast

# tokenizer and chat files a model directory may carry; the fine-tuned directory keeps the base's
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "generation_config.json")


def build_model(base_dir: Path, ft: FinetuneConfig) -> torch.nn.Module:
    """The base model in float32, its projections fused where the family has them (q/k/v, gate/up: the same
    function from fewer, larger matmuls; saved under the original names), with LoRA adapters (the rest frozen)
    when ft.lora > 0: one per targeted original projection; its linear layers' products planned per shape
    (train/planned_linear.py: the same products, each spread over the threads the way measured fastest)."""

    model = load_model(base_dir)
    if hasattr(model, "fuse_projections"):
        model.fuse_projections()
    if ft.lora > 0:
        inject_lora(model, ft.lora, ft.lora_alpha, ft.lora_targets, ft.lora_dropout)
    plan_linears(model)
    return model


class TokenizerFiles:
    """The base directory's tokenizer and chat files, as `save_model_dir` wants a tokenizer: `.save(dir)`."""

    def __init__(self, base_dir: Path, eos_token_id: int | None) -> None:
        self.base_dir, self.eos_token_id = base_dir, eos_token_id

    def save(self, out_dir: Path) -> None:
        for name in TOKENIZER_FILES:
            if (self.base_dir / name).is_file():
                shutil.copyfile(self.base_dir / name, Path(out_dir) / name)


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"


def _context(base_dir: Path) -> int:
    hf = read_json(base_dir / "config.json")  # GPT-2 calls it n_positions, the Llama family max_position_embeddings
    return int(hf.get("n_positions") or hf.get("max_position_embeddings") or 1024)


def encode_split(records: list[Any], formatter: Any, tokenizer: Any, max_len: int, rejects: Any) -> list[Any]:
    """Examples of the records; the ones that cannot be encoded go to `rejects` with their line."""


    out = []
    for r in records:
        ex = encode_conversation(r.extra["messages"], formatter, tokenizer, max_len)
        if isinstance(ex, str):
            file, line = r.origin or ("<unknown>", 0)
            detail = f"longer than {max_len} tokens" if ex == "too_long" else "the template does not split by turns"
            rejects.add(file, line, ex, json.dumps(r.extra["messages"], ensure_ascii=False), detail)
        else:
            out.append(ex)
    return out


def finetune(base_dir: str | Path, data_path: str | Path, out_dir: str | Path, cfg: Config, *,
             resume: bool = False, progress: bool = True) -> dict[str, Any]:
    """Fine-tune `base_dir` on `data_path`, write the model directory `out_dir`; returns the report. Reads
    [finetune] (sequence length, LoRA), [train] (steps, optimiser, precision: `tinystack finetune` starts it
    from config.FINETUNE_DEFAULTS), [data] (held-out share, dedup), [eval] (regression cases) and run.device."""

    base_dir, out_dir, ft = Path(base_dir), Path(out_dir), cfg.finetune
    if not (base_dir / "config.json").is_file():
        raise FileNotFoundError(f"{base_dir}: not a model directory (no config.json)")
    if ft.lora < 0:
        raise ValueError(f"finetune.lora must be >= 0, got {ft.lora}")
    if cfg.train.backend != "torch":
        raise ValueError(f"fine-tuning runs on torch: train.backend must be 'torch', got {cfg.train.backend!r}")
    work = out_dir.with_name(f"{out_dir.name}_finetune")
    tok = load_tokenizer(base_dir)
    formatter = chat_formatter(base_dir, tok)
    max_len = min(ft.max_seq_len or _context(base_dir), _context(base_dir))
    rejects = Rejects()
    prep = prepare_conversations(data_path, formatter, cfg.data, rejects)
    train_ex = encode_split(prep.train, formatter, tok, max_len, rejects)
    val_ex = encode_split(prep.val, formatter, tok, max_len, rejects)
    if not train_ex:
        raise ValueError(f"{data_path}: no training conversation fits in {max_len} tokens")
    main = is_main_process()
    if main:
        work.mkdir(parents=True, exist_ok=True)
        write_jsonl(work / "train.jsonl", prep.train)
        write_jsonl(work / "val.jsonl", prep.val)
        rejects.write(work / "rejected.jsonl")
    dropped = prep.dropped()
    console.print(f"finetune: {len(train_ex)} train / {len(val_ex)} held-out conversations; "
                  f"{sum(dropped.values())} removed ({_counts(dropped)}); {rejects.total} rejected lines "
                  f"({_counts(rejects.counts)})")
    pad = tok.eos_token_id if tok.eos_token_id is not None else 0
    tcfg = cfg.train
    val_batches = fixed_batches(val_ex, tcfg.batch_size, pad) if val_ex else None
    with torch_threads(cfg.run.threads):
        model, result = train_model(lambda: build_model(base_dir, ft), ConversationBatches(train_ex, tcfg.seed, pad),
                                    val_batches, tcfg, device=cfg.run.device, progress=progress, label="finetune",
                                    log_path=work / "log.jsonl" if main else None, ckpt_dir=work / "checkpoints",
                                    resume=resume)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    model = merge_lora(model).float().eval()
    report: dict[str, Any] = {
        "base_model": str(base_dir), "data": {"file": str(data_path), "sha256": file_sha256(data_path),
                                              **prep.summary(rejects)},
        "method": f"lora r={ft.lora}" if ft.lora > 0 else "full", "trainable_params": trainable,
        "result": result.to_dict(), "heldout": heldout_comparison(model, base_dir, val_batches, result.dtype,
                                                                  cfg.run.device, len(val_ex))}
    if not main:
        return report
    lineage = {**read_lineage(base_dir), "finetune": {**report, "config": dataclasses.asdict(ft),
                                                      "train": dataclasses.asdict(tcfg)}}
    save_model_dir(model, TokenizerFiles(base_dir, tok.eos_token_id), out_dir, lineage)
    write_json(work / "report.json", report)
    cases = heldout_cases(prep.val, tok, cfg.eval.regression_cases, max_len)
    if cases:
        write_cases(work / "regression.jsonl", cases)
    else:  # no held-out conversation: no set (not an earlier run's)
        (work / "regression.jsonl").unlink(missing_ok=True)
    if tcfg.plot:
        plot_loss_curve(work / "log.jsonl", work / "loss.png", title=f"{out_dir.name}: fine-tuning loss")
    console.print(f"finetune[{report['method']}]: {trainable:,} trainable parameters, {result.steps} steps in "
                  f"{result.wall_s:.1f}s, {result.tokens_per_s:,.0f} tokens/s -> {out_dir}")
    h = report["heldout"]
    if h["conversations"]:
        console.print(f"held-out ({h['conversations']} conversations, {h['assistant_tokens']} assistant tokens): "
                      f"base {h['base_loss']:.3f} -> fine-tuned {h['finetuned_loss']:.3f} nats/token "
                      f"({h['delta']:+.3f})")
    else:
        console.print("held-out: none (every source went to train; more sources or data.val_fraction)")
    if cases:
        console.print(f"regression set: {len(cases)} held-out chat cases -> {work / 'regression.jsonl'} (gate: "
                      f"tinystack eval regress --model {out_dir} --baseline {base_dir} --cases "
                      f"{work / 'regression.jsonl'})")
    return report


def heldout_cases(records: list[Any], tokenizer: Any, n_cases: int, max_len: int) -> list[Any]:
    """The regression gate's cases from the held-out conversations: each one's first answer after its user
    message, scored as the chat is served (eval.case_sets.build_chat_cases; the bar: a uniform guess)."""


    conversations = [(str(r.id if r.id is not None else (r.origin[1] if r.origin else i)), r.extra["messages"])
                     for i, r in enumerate(records)]
    return build_chat_cases(conversations, n_cases, math.log(tokenizer.vocab_size), tokenizer,
                            max_target_tokens=max(1, max_len // 2))


def heldout_comparison(model: torch.nn.Module, base_dir: Path, val_batches: Any, dtype: str, device: str,
                       n: int) -> dict[str, Any]:
    """Mean loss per assistant token of the fine-tuned and the base model on the held-out batches: the one
    scoring function (eval.scoring.score_batches), in the training precision."""

    if not val_batches:
        return {"conversations": 0, "assistant_tokens": 0, "base_loss": None, "finetuned_loss": None, "delta": None}
    with autocast(dtype, torch.device(device).type):
        tuned = score_batches(model, val_batches, device=device)
        base = score_batches(load_model(base_dir, device=device), val_batches, device=device)
    return {"conversations": n, "assistant_tokens": tuned.tokens, "base_loss": base.loss,
            "finetuned_loss": tuned.loss, "delta": tuned.loss - base.loss}
