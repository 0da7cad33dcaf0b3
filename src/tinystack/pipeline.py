"""The main job: raw text to a served answer, one stage per layer, in a work directory.

    corpus.jsonl  -> data/{train,val,test}.jsonl + manifest.json      (data)
                  -> tokenizer/tokenizer.json + {train,val,test}.bin  (tokenizer)
                  -> model/ (model directory) + train_log.jsonl       (train)
                  -> eval.json                                        (eval)
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


def stage_data(cfg: Config, inputs: list[Path], out_dir: Path) -> dict[str, Any]:
    from tinystack.data import prepare

    d = cfg.data
    manifest = prepare(inputs, out_dir, min_chars=d.min_chars, max_chars=d.max_chars, split_by=d.split_by,
                       val_fraction=d.val_fraction, test_fraction=d.test_fraction,
                       val_from=d.val_from, test_from=d.test_from)
    table = Table(title=f"data -> {out_dir}")
    for col in ("step", "in", "kept", "dropped"):
        table.add_column(col)
    for step in manifest["steps"]:
        dropped = ", ".join(f"{r}: {n:,}" for r, n in step["dropped"].items()) or "-"
        table.add_row(step["name"], f"{step['in']:,}", f"{step['kept']:,}", dropped)
    console.print(table)
    splits = manifest["splits"]
    console.print("splits: " + ", ".join(f"{k} {v['records']:,} records / {v['sources']:,} sources"
                                          for k, v in splits.items()))
    return {"hash": manifest["hash"], "splits": {k: v["records"] for k, v in splits.items()}}


def stage_tokenizer(cfg: Config, data_dir: Path, out_dir: Path) -> dict[str, Any]:
    from tinystack.tokenizer import BPETokenizer
    from tinystack.tokenizer.shards import encode_jsonl_to_bin

    texts, budget = [], cfg.tokenizer.max_train_chars
    with open(data_dir / "train.jsonl", encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["text"]
            texts.append(text)
            budget -= len(text)
            if budget <= 0:
                break
    t0 = time.perf_counter()
    tok = BPETokenizer.train(texts, vocab_size=cfg.tokenizer.vocab_size)
    train_s = time.perf_counter() - t0
    tok.save(out_dir)
    info: dict[str, Any] = {"fingerprint": tok.fingerprint(), "vocab_size": tok.vocab_size,
                            "train_chars": sum(map(len, texts)), "train_s": round(train_s, 2)}
    for split in ("train", "val", "test"):
        meta = encode_jsonl_to_bin(data_dir / f"{split}.jsonl", tok, out_dir / f"{split}.bin")
        info[f"{split}_tokens"] = meta["tokens"]
        info[f"{split}_bytes_per_token"] = round(meta["bytes"] / max(meta["tokens"], 1), 3)
    console.print(f"tokenizer: BPE vocab {tok.vocab_size:,} trained on {info['train_chars']:,} chars in "
                  f"{train_s:.1f}s; tokens train {info['train_tokens']:,} / val {info['val_tokens']:,} / "
                  f"test {info['test_tokens']:,} ({info['train_bytes_per_token']} bytes/token)")
    return info


def stage_train(cfg: Config, tok_dir: Path, model_dir: Path, log_path: Path, lineage: dict[str, Any]) -> dict[str, Any]:
    from tinystack.model.gpt import GPTConfig
    from tinystack.tokenizer import BPETokenizer
    from tinystack.tokenizer.shards import load_tokens
    from tinystack.train import save_model_dir, train

    tok = BPETokenizer.load(tok_dir)
    m = cfg.model
    gcfg = GPTConfig(vocab_size=tok.vocab_size, block_size=m.block_size, n_layer=m.n_layer, n_head=m.n_head,
                     n_embd=m.n_embd, dropout=m.dropout)
    val_path = tok_dir / "val.bin"
    val = load_tokens(val_path) if val_path.is_file() and len(load_tokens(val_path)) > m.block_size else None
    model, result = train(gcfg, load_tokens(tok_dir / "train.bin"), val, cfg.train, device=cfg.run.device,
                          log_path=log_path)
    lineage = {**lineage, "training": {"model": asdict(m), "train": asdict(cfg.train)}, "result": result.to_dict()}
    save_model_dir(model, tok, model_dir, lineage)
    val_txt = f", val loss {result.final_val_loss:.3f}" if result.final_val_loss is not None else ""
    console.print(f"train: {model.num_params():,} parameters, {result.steps} steps in {result.wall_s:.1f}s, "
                  f"{result.tokens_per_s:,.0f} tokens/s, train loss {result.final_train_loss:.3f}{val_txt} -> {model_dir}")
    return {**result.to_dict(), "weights_sha256": file_sha256(model_dir / "model.safetensors")}


def stage_eval(cfg: Config, model_dir: Path, tok_dir: Path, out: Path) -> dict[str, Any]:
    from tinystack.eval import evaluate_tokens
    from tinystack.model.io import load_model
    from tinystack.tokenizer import BPETokenizer
    from tinystack.tokenizer.shards import load_tokens, token_byte_lengths

    model = load_model(model_dir, device=cfg.run.device)
    nbytes = token_byte_lengths(BPETokenizer.load(model_dir))
    results: dict[str, Any] = {"model": str(model_dir)}
    for split in ("val", "test"):
        tokens = load_tokens(tok_dir / f"{split}.bin")
        if len(tokens) <= model.config.block_size:
            results[split] = {"skipped": f"only {len(tokens)} tokens"}
            continue
        results[split] = evaluate_tokens(model, tokens, nbytes, max_windows=cfg.eval.max_windows,
                                         batch_size=cfg.eval.batch_size, device=cfg.run.device)
        r = results[split]
        console.print(f"eval {split}: loss {r['loss']:.3f}, perplexity {r['perplexity']:.1f}, "
                      f"bits/byte {r['bits_per_byte']:.3f} over {r['tokens']:,} tokens")
    write_json(out, results)
    return {k: v for k, v in results.items() if k != "model"}


def stage_demo(cfg: Config, model_dir: Path, log_path: Path) -> list[dict[str, Any]]:
    """Start the real server on 127.0.0.1, send the demo prompts, print answers and timing."""
    import httpx

    from tinystack.infer import Engine
    from tinystack.observe import setup_request_log
    from tinystack.serve import create_app, run_in_background

    engine = Engine.from_dir(model_dir, device=cfg.run.device)
    request_log = setup_request_log(log_path)
    answers = []
    try:
        app = create_app(engine, cfg.serve, request_log=request_log)
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
    evaluated = cache.run("eval", _key(asdict(cfg.eval), trained["weights_sha256"], tok["fingerprint"]),
                          [workdir / "eval.json"], lambda: stage_eval(cfg, model_dir, tok_dir, workdir / "eval.json"))
    lineage_path = model_dir / "tinystack.json"
    metrics = {split: evaluated[split] for split in ("val", "test")}
    write_json(lineage_path, {**read_json(lineage_path), "metrics": metrics})  # final metrics join the lineage
    summary.update(data=data, tokenizer=tok, train=trained, eval=evaluated)
    if serve_demo:
        summary["demo"] = stage_demo(cfg, model_dir, workdir / "logs" / "requests.jsonl")
    console.print(f"\n[bold]done.[/bold] everything is in {workdir}/: data/ (splits + manifest.json), tokenizer/, "
                  f"model/ (model directory), train_log.jsonl, eval.json, logs/requests.jsonl, stages.json")
    return summary
