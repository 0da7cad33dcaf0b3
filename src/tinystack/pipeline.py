"""The main job: raw text to a served answer, one stage per layer, in a work directory.

    corpus.jsonl  -> data/{train,val,test}.jsonl + manifest.json      (data)
                  -> tokenizer/tokenizer.json + {train,val,test}.bin  (tokenizer)
                  -> model/ (model directory) + train_log.jsonl       (train)
                  -> eval.json (metrics, slices, bad cases, leakage)  (eval)
                  -> regression.jsonl + regression.json               (eval: regression set)
                  -> report.md + report.html                          (eval: report)
                  -> a server on 127.0.0.1 answering a few requests   (serve + observe)

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

from rich.console import Console
from rich.table import Table

from tinystack.atomic import read_json, write_json
from tinystack.config import Config

console = Console(soft_wrap=True)  # long status lines stay whole in logs and CI output


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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


# --- the stages; each is also what the matching CLI subcommand calls ----------------------------

def stage_corpus(cfg: Config, out: Path) -> dict[str, Any]:
    from tinystack.data import build_corpus

    stats = build_corpus(out, max_docs=cfg.data.corpus_max_docs)
    console.print(f"corpus: {stats['records']:,} docstrings from {stats['sources']:,} modules -> {out}")
    return stats


def stage_data(cfg: Config, inputs: list[Path], out_dir: Path, progress: bool = True) -> dict[str, Any]:
    from tinystack.data import prepare
    from tinystack.data.options import prepare_kwargs
    from tinystack.data.report import summary_table

    t0 = time.perf_counter()
    manifest = prepare(inputs, out_dir, progress=progress, **prepare_kwargs(cfg.data))
    rate = manifest["records_in"] / max(time.perf_counter() - t0, 1e-9)  # not in the manifest: it stays deterministic
    console.print(summary_table({**manifest, "docs_per_s": rate}, f"data -> {out_dir}"))
    splits = manifest["splits"]
    console.print("splits: " + ", ".join(f"{k} {v['records']:,} records / {v['sources']:,} sources"
                                          for k, v in splits.items()))
    return {"hash": manifest["hash"], "splits": {k: v["records"] for k, v in splits.items()}}


def stage_tokenizer(cfg: Config, data_dir: Path, out_dir: Path) -> dict[str, Any]:
    from tinystack.tokenizer import BPETokenizer, CharTokenizer
    from tinystack.tokenizer.shards import encode_jsonl_to_bin, read_jsonl_texts, split_by_position

    t = cfg.tokenizer
    if t.kind not in ("bpe", "char"):
        raise ValueError(f"tokenizer.kind must be 'bpe' or 'char', got {t.kind!r}")
    splits = ("train", "val", "test")
    if t.position_split > 0:  # one continuous text (e.g. a single book): every record, in order, re-split by position
        whole = "\n\n".join(x for s in splits for x in read_jsonl_texts(data_dir / f"{s}.jsonl"))
        texts = [whole[: t.max_train_chars]] if t.kind == "bpe" else [whole]
    else:
        texts = read_jsonl_texts(data_dir / "train.jsonl", t.max_train_chars)
    t0 = time.perf_counter()
    tok = CharTokenizer.train(texts) if t.kind == "char" else BPETokenizer.train(texts, vocab_size=t.vocab_size)
    train_s = time.perf_counter() - t0
    tok.save(out_dir)
    info: dict[str, Any] = {"fingerprint": tok.fingerprint(), "vocab_size": tok.vocab_size, "kind": t.kind,
                            "train_chars": sum(map(len, texts)), "train_s": round(train_s, 2)}
    if t.position_split > 0:
        metas = split_by_position(whole, tok, out_dir, t.position_split)
    else:
        metas = {s: encode_jsonl_to_bin(data_dir / f"{s}.jsonl", tok, out_dir / f"{s}.bin") for s in splits}
    for split, meta in metas.items():
        info[f"{split}_tokens"] = meta["tokens"]
        info[f"{split}_bytes_per_token"] = round(meta["bytes"] / max(meta["tokens"], 1), 3)
    split_txt = f", split by position ({1 - t.position_split:.0%}/{t.position_split:.0%})" if t.position_split > 0 else ""
    console.print(f"tokenizer: {t.kind} vocab {tok.vocab_size:,} trained on {info['train_chars']:,} chars in "
                  f"{train_s:.1f}s; tokens train {info['train_tokens']:,} / val {info['val_tokens']:,} / "
                  f"test {info['test_tokens']:,} ({info['train_bytes_per_token']} bytes/token){split_txt}")
    return info


def stage_train(cfg: Config, tok_dir: Path, model_dir: Path, log_path: Path, lineage: dict[str, Any],
                *, resume: bool = False, ckpt_dir: Path | None = None) -> dict[str, Any]:
    """Train (torch or numpy backend, `[train] backend`), write the model directory, the log's PNG curve.
    Checkpoints go to `ckpt_dir` (default: <model_dir>_checkpoints beside it); `resume` continues from there."""
    from tinystack.model.gpt import GPTConfig
    from tinystack.tokenizer import load_tokenizer
    from tinystack.tokenizer.shards import load_tokens
    from tinystack.train import save_model_dir, train
    from tinystack.train.distributed import is_main_process

    tok = load_tokenizer(tok_dir)
    m = cfg.model
    gcfg = GPTConfig(vocab_size=tok.vocab_size, block_size=m.block_size, n_layer=m.n_layer, n_head=m.n_head,
                     n_embd=m.n_embd, dropout=m.dropout)
    val_path = tok_dir / "val.bin"
    val = load_tokens(val_path) if val_path.is_file() and len(load_tokens(val_path)) > m.block_size else None
    train_tokens = load_tokens(tok_dir / "train.bin")
    if cfg.train.backend == "numpy":
        if resume:
            raise ValueError("--resume needs the torch backend (the numpy backend writes no checkpoints)")
        from tinystack.nn.gpt_io import to_torch
        from tinystack.train.numpy_loop import train_numpy

        np_model, result = train_numpy(gcfg, train_tokens, val, cfg.train, log_path=log_path)
        model = to_torch(np_model)
    elif cfg.train.backend == "torch":
        ckpt_dir = ckpt_dir or model_dir.with_name(f"{model_dir.name}_checkpoints")
        model, result = train(gcfg, train_tokens, val, cfg.train, device=cfg.run.device, log_path=log_path,
                              ckpt_dir=ckpt_dir, resume=resume)
    else:
        raise ValueError(f"train.backend must be 'torch' or 'numpy', got {cfg.train.backend!r}")
    info = result.to_dict()
    if not is_main_process():  # DDP: rank 0 writes the model directory
        return info
    lineage = {**lineage, "training": {"model": asdict(m), "train": asdict(cfg.train)}, "result": info}
    save_model_dir(model, tok, model_dir, lineage)
    if cfg.train.plot:
        from tinystack.train.plot import plot_loss_curve

        try:
            plot_loss_curve(log_path, log_path.with_suffix(".png"), title=f"{model_dir.name}: loss")
        except ImportError:
            console.print("[dim]train: matplotlib is not installed, no loss-curve PNG[/dim]")
    val_txt = f", val loss {result.final_val_loss:.3f}" if result.final_val_loss is not None else ""
    console.print(f"train[{cfg.train.backend}]: {model.num_params():,} parameters, {result.steps} steps in "
                  f"{result.wall_s:.1f}s, {result.tokens_per_s:,.0f} tokens/s, train loss "
                  f"{result.final_train_loss:.3f}{val_txt} -> {model_dir}")
    return {**info, "weights_sha256": file_sha256(model_dir / "model.safetensors")}


def stage_eval(cfg: Config, model_dir: Path, tok_dir: Path | None, out: Path,
               data_dir: Path | None = None) -> dict[str, Any]:
    """Offline metrics to `out` (eval.json); with `data_dir` also slices, bad cases, leakage and
    generation checks (tinystack.eval). Returns the per-split window metrics (for the lineage)."""
    from tinystack.eval.gate import load_model_dir
    from tinystack.eval.generation import generation_checks
    from tinystack.eval.offline import SPLITS, evaluate_model
    from tinystack.eval.show import print_eval
    from tinystack.eval.threads import torch_threads

    model, tokenizer = load_model_dir(model_dir, device=cfg.run.device)
    results: dict[str, Any] = {"model": str(model_dir)}
    with torch_threads(cfg.eval.threads):
        results.update(evaluate_model(model, tokenizer, cfg.eval, data_dir=data_dir, tok_dir=tok_dir,
                                      device=cfg.run.device))
        results["generation"] = generation_checks(model, tokenizer, cfg.eval.gen_prompts or cfg.run.demo_prompts,
                                                  max_tokens=cfg.eval.gen_max_tokens, device=cfg.run.device)
    write_json(out, results)
    print_eval(console, results)
    return {s: {k: v for k, v in results[s].items() if k != "docs"} for s in SPLITS}


def stage_regression(cfg: Config, model_dir: Path, data_dir: Path, workdir: Path) -> dict[str, Any]:
    """Build regression.jsonl from the held-out splits, run it (against eval.baseline if set) -> regression.json."""
    from tinystack.eval.gate import build_heldout_cases, run_regression
    from tinystack.eval.regression import write_cases
    from tinystack.eval.show import print_regression
    from tinystack.eval.threads import torch_threads

    cases = build_heldout_cases(model_dir, data_dir, cfg.eval.regression_cases)
    write_cases(workdir / "regression.jsonl", cases)
    with torch_threads(cfg.eval.threads):
        result = run_regression(model_dir, cases, Path(cfg.eval.baseline) if cfg.eval.baseline else None,
                                tolerance=cfg.eval.regression_tolerance, device=cfg.run.device)
    write_json(workdir / "regression.json", result)
    print_regression(console, result)
    return result["summary"]


def stage_report(cfg: Config, workdir: Path) -> dict[str, Any]:
    """report.md + self-contained report.html from eval.json, regression.json and train_log.jsonl."""
    from tinystack.eval.report import write_report

    return write_report(workdir)


def stage_demo(cfg: Config, model_dir: Path, log_path: Path) -> list[dict[str, Any]]:
    """Start the real server on 127.0.0.1, send the demo prompts, print answers and timing."""
    import httpx

    from tinystack.observe import setup_request_log
    from tinystack.serve import create_app, run_in_background
    from tinystack.serve.engine.adapter import load_engine

    engine = load_engine(model_dir, cfg.infer, cfg.run.device)  # the construction `tinystack serve` uses
    request_log = setup_request_log(log_path)
    answers = []
    try:
        app = create_app(engine, cfg.serve, request_log=request_log, model_dir=model_dir)
        with run_in_background(app, host="127.0.0.1", port=cfg.run.demo_port) as url:
            console.print(f"serve: server up at {url}")
            with httpx.Client(base_url=url, timeout=cfg.serve.timeout_s + 5) as client:
                for i, prompt in enumerate(cfg.run.demo_prompts):
                    body = {"prompt": prompt, "max_tokens": cfg.run.demo_max_tokens, "temperature": 0.8,
                            "top_k": 50, "top_p": 0.95, "seed": i}
                    resp = client.post("/generate", json=body)
                    resp.raise_for_status()
                    answers.append(resp.json())
    finally:
        request_log.close()
        engine.shutdown()  # the AsyncEngine's thread
    table = Table(title="demo requests (POST /generate)")
    for col in ("prompt -> completion", "tokens", "queue ms", "infer ms", "total ms"):
        table.add_column(col)
    for prompt, a in zip(cfg.run.demo_prompts, answers):
        t = a["timing"]
        text = (prompt + "[bold]" + a["text"].replace("[", r"\[") + "[/bold]").replace("\n", " ")
        table.add_row(text, str(a["completion_tokens"]), f"{t['queue_ms']:.1f}", f"{t['inference_ms']:.1f}",
                      f"{t['total_ms']:.1f}")
    console.print(table)
    return answers


def run_pipeline(cfg: Config, workdir: Path, serve_demo: bool = True) -> dict[str, Any]:
    """Run every stage in `workdir`, reusing the ones whose inputs have not changed."""
    workdir.mkdir(parents=True, exist_ok=True)
    write_json(workdir / "config.json", cfg.to_dict())
    cache = StageCache(workdir)
    summary: dict[str, Any] = {"workdir": str(workdir)}

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
    baseline = Path(cfg.eval.baseline) / "model.safetensors"
    regression = cache.run("regression", _key(eval_key, file_sha256(baseline) if baseline.is_file() else ""),
                           [workdir / "regression.jsonl", workdir / "regression.json"],
                           lambda: stage_regression(cfg, model_dir, data_dir, workdir))
    report_inputs = [workdir / "eval.json", workdir / "regression.json", workdir / "train_log.jsonl"]
    cache.run("report", _key([file_sha256(p) for p in report_inputs if p.is_file()]),
              [workdir / "report.md", workdir / "report.html"], lambda: stage_report(cfg, workdir))
    console.print(f"report: {workdir / 'report.html'} (and report.md)")
    summary.update(data=data, tokenizer=tok, train=trained, eval=evaluated, regression=regression,
                   report=str(workdir / "report.html"))
    if serve_demo:
        summary["demo"] = stage_demo(cfg, model_dir, workdir / "logs" / "requests.jsonl")
    console.print(f"\n[bold]done.[/bold] everything is in {workdir}/: data/ (splits + manifest.json), tokenizer/, "
                  f"model/ (model directory), train_log.jsonl, eval.json, regression.jsonl/.json, report.md/.html, "
                  f"logs/requests.jsonl, stages.json")
    return summary
