"""The main job: raw text to a served answer, one stage per layer, in a work directory.

    corpus.jsonl  -> data/{train,val,test}.jsonl + manifest.json      (data)
                  -> tokenizer/tokenizer.json + {train,val,test}.bin  (tokenizer)
                  -> model/ (model directory) + train_log.jsonl       (train)
                  -> eval.json (metrics, slices, bad cases, leakage)  (eval)
                  -> regression.jsonl + regression.json               (eval: the gate's regression set, side
                                                                       by side with the registry's current model)
                  -> report.md + report.html                          (eval: report)
                  -> a server on 127.0.0.1 answering a few requests   (serve + observe)
    [run] pretrained -> pretrained/ (imported model directory)        (model: import)
                  -> the same server on it answering chat questions   (serve: /v1/chat/completions)

Each stage has a key: a hash of its config section and of what it reads (the
previous stage's output hash). `stages.json` remembers the key each stage last
finished with; a re-run skips a stage whose key and outputs are unchanged, so
editing `[train]` retrains and re-evaluates but does not re-tokenize.
"""
from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from tinystack.atomic import file_sha256, read_json, write_json
from tinystack.config import Config
from tinystack.data.stage import stage_corpus, stage_data
from tinystack.eval.promotion import NotPromoted, promote_if_better
from tinystack.eval.registry import ModelRegistry
from tinystack.eval.regression import load_cases
from tinystack.eval.stage import stage_eval, stage_regression, stage_report
from tinystack.model.stage import pretrained_key, stage_import
from tinystack.progress import console
from tinystack.serve.stage import stage_chat_demo, stage_demo
from tinystack.tokenizer.stage import stage_tokenizer
from tinystack.train.stage import stage_train


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


class StageCache:
    """stages.json: which stage finished with which key, and the facts it reported."""

    def __init__(self, workdir: Path):
        self.path = workdir / "stages.json"
        self.state: dict[str, Any] = read_json(self.path) if self.path.is_file() else {}

    def run(self, name: str, key: str, outputs: list[Path], fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        done = self.state.get(name)
        if done and done["key"] == key and all(p.exists() for p in outputs):
            console.print(f"[dim]{name}: up to date, reusing {', '.join(str(p) for p in outputs)}[/dim]")
            return done["info"]
        t0 = time.perf_counter()
        info = fn()
        info["seconds"] = round(time.perf_counter() - t0, 2)
        self.state[name] = {"key": key, "info": info}
        write_json(self.path, self.state)
        return info


def run_pipeline(cfg: Config, workdir: Path, serve_demo: bool = True, promote: bool = True) -> dict[str, Any]:
    """Run every stage in `workdir`, reusing the ones whose inputs have not changed; then promote the model
    into the registry if the gate allows (raises NotPromoted, after the demo, when it does not)."""
    workdir.mkdir(parents=True, exist_ok=True)
    write_json(workdir / "config.json", cfg.to_dict())
    cache = StageCache(workdir)
    summary: dict[str, Any] = {"workdir": str(workdir)}
    # the pretrained model is found before anything runs: a missing one fails now, not after training
    pretrained_source = pretrained_key(cfg.run.pretrained) if serve_demo and cfg.run.pretrained else None

    if cfg.data.inputs:
        inputs = [Path(p) for p in cfg.data.inputs]
        for p in inputs:
            if not p.exists():
                raise FileNotFoundError(f"data input not found: {p}")
    else:
        corpus = workdir / "corpus.jsonl"
        cache.run("corpus", _key(cfg.data.corpus_max_docs, sys.version), [corpus], lambda: stage_corpus(cfg, corpus))
        inputs = [corpus]
    input_hashes = [file_sha256(p) if p.is_file() else str(p) for p in inputs]

    data_dir, tok_dir, model_dir = workdir / "data", workdir / "tokenizer", workdir / "model"
    data = cache.run("data", _key(asdict(cfg.data), input_hashes),
                     [data_dir / f"{s}.jsonl" for s in ("train", "val", "test")] + [data_dir / "manifest.json"],
                     lambda: stage_data(cfg, inputs, data_dir))
    tok = cache.run("tokenizer", _key(asdict(cfg.tokenizer), data["hash"]),
                    [tok_dir / "tokenizer.json"] + [tok_dir / f"{s}.bin" for s in ("train", "val", "test")],
                    lambda: stage_tokenizer(cfg, data_dir, tok_dir))
    lineage = {"data_manifest_hash": data["hash"], "tokenizer_hash": tok["fingerprint"]}
    trained = cache.run("train", _key(asdict(cfg.model), asdict(cfg.train), cfg.run.device, lineage),
                        [model_dir / "model.safetensors", model_dir / "tinystack.json"],
                        lambda: stage_train(cfg, tok_dir, model_dir, workdir / "train_log.jsonl", lineage))
    eval_key = _key(asdict(cfg.eval), cfg.run.demo_prompts, trained["weights_sha256"], tok["fingerprint"], data["hash"])
    evaluated = cache.run("eval", eval_key, [workdir / "eval.json"],
                          lambda: stage_eval(cfg, model_dir, tok_dir, workdir / "eval.json", data_dir))
    lineage_path = model_dir / "tinystack.json"
    metrics = {split: evaluated[split] for split in ("val", "test")}
    write_json(lineage_path, {**read_json(lineage_path), "metrics": metrics})  # final metrics join the lineage
    registry = ModelRegistry(cfg.run.registry)
    current = registry.current(cfg.run.name)
    baseline_sha = registry.record(cfg.run.name)["model_sha256"] if current else ""
    regression = cache.run("regression", _key(eval_key, cfg.run.name, current, baseline_sha),
                           [workdir / "regression.jsonl", workdir / "regression.json"],
                           lambda: stage_regression(cfg, model_dir, data_dir, workdir))
    report_inputs = [workdir / "eval.json", workdir / "regression.json", workdir / "train_log.jsonl"]
    cache.run("report", _key([file_sha256(p) for p in report_inputs if p.is_file()]),
              [workdir / "report.md", workdir / "report.html"], lambda: stage_report(cfg, workdir))
    console.print(f"report: {workdir / 'report.html'} (and report.md)")
    summary.update(data=data, tokenizer=tok, train=trained, eval=evaluated, regression=regression,
                   report=str(workdir / "report.html"))
    decision: Exception | None = None
    if promote:
        try:
            version = promote_if_better(registry, cfg.run.name, model_dir, read_json(workdir / "regression.json"),
                                        load_cases(workdir / "regression.jsonl"), cfg.eval.regression_tolerance,
                                        workdir)
            console.print(f"[green]promoted[/green]: {cfg.run.name} {version} is current in {registry.root} "
                          f"(serve it with --model registry:{cfg.run.name})")
            summary["promoted"] = version
        except NotPromoted as e:
            decision = e
            console.print(f"[red]{e}[/red]")
    if serve_demo:
        summary["demo"] = stage_demo(cfg, model_dir, workdir / "logs" / "requests.jsonl")
    pretrained_dir = workdir / "pretrained"
    if pretrained_source:
        summary["pretrained"] = cache.run("pretrained", _key(cfg.run.pretrained, pretrained_source),
                                          [pretrained_dir / "model.safetensors", pretrained_dir / "tinystack.json"],
                                          lambda: stage_import(cfg, pretrained_dir))
        summary["chat_demo"] = stage_chat_demo(cfg, pretrained_dir, workdir / "logs" / "chat_requests.jsonl")
    console.print(f"\n[bold]done.[/bold] everything is in {workdir}/: data/ (splits + manifest.json), tokenizer/, "
                  f"model/ (model directory), train_log.jsonl, eval.json, regression.jsonl/.json, report.md/.html, "
                  f"logs/requests.jsonl, stages.json")
    if decision is not None:
        raise decision
    return summary
