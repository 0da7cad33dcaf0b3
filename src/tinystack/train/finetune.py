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
      -> the forgetting guard (guard.py)        the base's greedy answers to general prompts, recorded before
                                                training, scored on the tuned model: a model that forgot is
                                                written marked rejected and the command fails (ForgettingError)
                                                unless finetune.allow_forgetting; finetune.replay mixes the
                                                base's answers to other general prompts into training

The defaults (config.FINETUNE_DEFAULTS) are LoRA with the schedule from the data size (schedule()): steps for
finetune.epochs passes, the learning rate by method, held-out loss twice an epoch with early stopping, the best
weights kept.

Beside OUT, in OUT_finetune/: adapter/ (with LoRA: the adapters unmerged, in PEFT's layout, to serve beside the
base with `serve --lora-modules`), train.jsonl and val.jsonl (the prepared conversations),
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
from tinystack.config import Config, FinetuneConfig, TrainConfig
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
from tinystack.train.finetune_registry import register, versus_current
from tinystack.train.guard import ForgettingError, ForgettingGuard
from tinystack.train.loop import train_model
from tinystack.train.lora import extract_adapter, inject_lora, merge_lora
from tinystack.train.planned_linear import plan_linears, unplan_linears
from tinystack.train.plot import plot_loss_curve
from tinystack.train.precision import autocast

LORA_LR, FULL_LR = 2e-3, 2e-5  # train.learning_rate 0: by method (a few hundred conversations; docs/train.md)
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


def schedule(tcfg: TrainConfig, ft: FinetuneConfig, n_train: int) -> TrainConfig:
    """[train] with FINETUNE_DEFAULTS' zeros filled from the data: max_iters 0 = finetune.epochs passes over
    `n_train` conversations, learning_rate 0 = LORA_LR or FULL_LR by method, min_lr 0 = a tenth of it,
    eval_interval 0 = twice an epoch; warmup at most a fifth of the steps."""
    per_epoch = max(1, math.ceil(n_train / (tcfg.batch_size * tcfg.grad_accum_steps)))
    steps = tcfg.max_iters or max(1, math.ceil(ft.epochs * per_epoch))
    lr = tcfg.learning_rate or (LORA_LR if ft.lora > 0 else FULL_LR)
    return dataclasses.replace(tcfg, max_iters=steps, learning_rate=lr, min_lr=tcfg.min_lr or lr / 10,
                               eval_interval=tcfg.eval_interval or max(1, per_epoch // 2),
                               warmup_iters=min(tcfg.warmup_iters, steps // 5))


def finetune(base_dir: str | Path, data_path: str | Path, out_dir: str | Path, cfg: Config, *,
             resume: bool = False, progress: bool = True) -> dict[str, Any]:
    """Fine-tune `base_dir` on `data_path`, write the model directory `out_dir`; returns the report. Reads
    [finetune] (sequence length, LoRA, the guard, replay), [train] (steps, optimiser, precision: `tinystack
    finetune` starts it from config.FINETUNE_DEFAULTS), [data] (held-out share, dedup), [eval] (regression
    cases) and run.device. Raises ForgettingError after writing a model that failed the guard."""

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
    dropped = prep.dropped()
    what = (f"{len(train_ex)} train / {len(val_ex)} held-out conversations; {sum(dropped.values())} removed "
            f"({_counts(dropped)}); {rejects.total} rejected lines ({_counts(rejects.counts)})")
    if not train_ex or not val_ex:  # refused before anything is written
        split = "training" if not train_ex else "held-out"
        hint = "" if train_ex else " (more sources or a larger data.val_fraction: the split is by source)"
        raise ValueError(f"{data_path}: no {split} conversation left: {what}{hint}")
    with torch_threads(cfg.run.threads):  # the base's answers (a resume records the same ones again)
        guard = ForgettingGuard.record(base_dir, tok, formatter, ft, max_len, cfg.run.device)
    replayed = encode_split_messages(guard.replay_conversations() if guard else [], formatter, tok, max_len)
    main = is_main_process()
    if main:
        work.mkdir(parents=True, exist_ok=True)
        write_jsonl(work / "train.jsonl", prep.train)
        write_jsonl(work / "val.jsonl", prep.val)
        rejects.write(work / "rejected.jsonl")
    console.print(f"finetune: {what}" + (f"; + {len(replayed)} replayed base answers" if ft.replay else ""))
    pad = tok.eos_token_id if tok.eos_token_id is not None else 0
    tcfg = schedule(cfg.train, ft, len(train_ex) + len(replayed))
    val_batches = fixed_batches(val_ex, tcfg.batch_size, pad)
    with torch_threads(cfg.run.threads):
        model, result = train_model(lambda: build_model(base_dir, ft),
                                    ConversationBatches(train_ex + replayed, tcfg.seed, pad), val_batches, tcfg,
                                    device=cfg.run.device, progress=progress, label="finetune",
                                    log_path=work / "log.jsonl" if main else None, ckpt_dir=work / "checkpoints",
                                    resume=resume)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        adapter = extract_adapter(model) if ft.lora > 0 else None  # unmerged, for serving beside the base
        model = merge_lora(model).float().eval()
        unplan_linears(model)  # an ordinary module again: scored, guarded and saved as inference loads it
        heldout = heldout_comparison(model, base_dir, val_batches, result.dtype, cfg.run.device, len(val_ex))
        if ft.register and adapter is not None and main:  # the registry's gate: also the adapter it would replace
            heldout["current"] = versus_current(cfg.run.registry, ft.register, base_dir, val_batches,
                                                heldout["finetuned_loss"], result.dtype, cfg.run.device)
        kept = guard.check(model) if guard else None
    rejected = kept is not None and not kept["passed"] and not ft.allow_forgetting
    report: dict[str, Any] = {
        "base_model": str(base_dir), "data": {"file": str(data_path), "sha256": file_sha256(data_path),
                                              **prep.summary(rejects), "replayed": len(replayed)},
        "method": f"lora r={ft.lora}" if ft.lora > 0 else "full", "trainable_params": trainable,
        "schedule": {k: getattr(tcfg, k) for k in ("max_iters", "learning_rate", "min_lr", "eval_interval")},
        "result": result.to_dict(), "heldout": heldout, "retention": kept,
        "rejected": "; ".join(kept["reasons"]) if rejected else None,
        "adapter": str(work / "adapter") if adapter is not None else None}
    if not main:
        return report
    lineage = {**read_lineage(base_dir), "finetune": {**report, "config": dataclasses.asdict(ft),
                                                      "train": dataclasses.asdict(tcfg)}}
    save_model_dir(model, TokenizerFiles(base_dir, tok.eos_token_id), out_dir, lineage)
    if adapter is not None:  # PEFT's layout: `tinystack serve --model BASE --lora-modules NAME=this`
        adapter.save(work / "adapter", base_model=str(base_dir))
    write_json(work / "report.json", report)
    cases = heldout_cases(prep.val, tok, cfg.eval.regression_cases, max_len)
    if cases:
        write_cases(work / "regression.jsonl", cases)
    else:  # no held-out conversation: no set (not an earlier run's)
        (work / "regression.jsonl").unlink(missing_ok=True)
    if tcfg.plot:
        plot_loss_curve(work / "log.jsonl", work / "loss.png", title=f"{out_dir.name}: fine-tuning loss")
    _print_report(report, result, trainable, out_dir, work, base_dir, cases)
    if ft.register:
        register(ft.register, out_dir, work / "adapter" if adapter is not None else None, report, base_dir,
                 cfg.run.registry)
    if rejected:
        raise ForgettingError(f"{out_dir} forgot what {base_dir.name} knew: {report['rejected']}; written "
                              "marked rejected (never promotable); --replay N or a smaller learning rate usually "
                              "helps, --allow-forgetting accepts it")
    return report


def _print_report(report: dict[str, Any], result: Any, trainable: int, out_dir: Path, work: Path, base_dir: Path,
                  cases: list[Any]) -> None:
    stop = f" (early stop; best at step {result.best_step})" if result.stopped_early else (
        f" (best at step {result.best_step})" if result.best_step not in (None, result.steps) else "")
    console.print(f"finetune[{report['method']}]: {trainable:,} trainable parameters, {result.steps} steps{stop} in "
                  f"{result.wall_s:.1f}s, {result.tokens_per_s:,.0f} tokens/s -> {out_dir}")
    h, r = report["heldout"], report["retention"]
    console.print(f"target  held-out ({h['conversations']} conversations, {h['assistant_tokens']} assistant tokens): "
                  f"base {h['base_loss']:.3f} -> fine-tuned {h['finetuned_loss']:.3f} nats/token ({h['delta']:+.3f})")
    if h.get("current"):
        c = h["current"]
        console.print(f"        against {c['version']}, the current adapter of its registry name: {c['loss']:.3f} -> "
                      f"{h['finetuned_loss']:.3f} nats/token ({c['delta']:+.3f})")
    if r is None:
        console.print("retention: not measured (finetune.guard_prompts 0 and no finetune.guard_file)")
    else:
        console.print(f"retention ({r['prompts']} general prompts): base answers {r['nll_increase']:+.3f} nats/token "
                      f"less likely; facts kept {r['facts_kept']}/{r['facts_base_right']} "
                      f"({r['fact_retention']:.0%}) -> {'ok' if r['passed'] else 'FORGOT'}")
    if cases:
        console.print(f"regression set: {len(cases)} held-out chat cases -> {work / 'regression.jsonl'} (gate: "
                      f"tinystack eval regress --model {out_dir} --baseline {base_dir} --cases "
                      f"{work / 'regression.jsonl'})")


def encode_split_messages(conversations: list[list[dict[str, str]]], formatter: Any, tokenizer: Any,
                          max_len: int) -> list[Any]:
    """Examples of generated conversations (replay); ones that do not fit are left out."""
    out = [encode_conversation(m, formatter, tokenizer, max_len) for m in conversations]
    return [ex for ex in out if not isinstance(ex, str)]


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

    with autocast(dtype, torch.device(device).type):
        tuned = score_batches(model, val_batches, device=device)
        base = score_batches(load_model(base_dir, device=device), val_batches, device=device)
    return {"conversations": n, "assistant_tokens": tuned.tokens, "base_loss": base.loss,
            "finetuned_loss": tuned.loss, "delta": tuned.loss - base.loss}
