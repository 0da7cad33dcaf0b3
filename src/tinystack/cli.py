"""The one command line: `tinystack run | data | tokenizer | train | eval | generate | serve | bench`.

Every subcommand takes `--config FILE.toml` and any number of `--set section.key=value`
overrides, and calls the same stage functions `tinystack run` chains
(`tinystack.pipeline`), so a stage run by hand gives what the pipeline gives.
Errors the user can fix (bad config, missing file, bad input) print one line and
exit with status 2, never a traceback (set TINYSTACK_DEBUG=1 to see one).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from tinystack.config import Config, ConfigError, load_config

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="tinystack: data -> tokenizer -> training -> evaluation -> inference -> serving.")
data_app = typer.Typer(no_args_is_help=True, help="Build, clean, dedup and split data.")
tok_app = typer.Typer(no_args_is_help=True, help="Train the BPE tokenizer and encode splits.")
app.add_typer(data_app, name="data")
app.add_typer(tok_app, name="tokenizer")

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="TOML config file.")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="Override: section.key=value (repeatable).")]


def _cfg(config: Path | None, overrides: list[str] | None) -> Config:
    return load_config(config, overrides or [])


@app.command()
def run(config: ConfigOpt = None, workdir: Annotated[Optional[Path], typer.Option(help="Work directory (default runs/<timestamp>).")] = None,
        set_: SetOpt = None, no_serve: Annotated[bool, typer.Option("--no-serve", help="Skip the server demo.")] = False) -> None:
    """Run the whole pipeline on the built-in corpus (or [data].inputs): data -> ... -> served answers."""
    from tinystack.pipeline import run_pipeline

    cfg = _cfg(config, set_)
    wd = workdir or Path(cfg.run.workdir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}")
    run_pipeline(cfg, wd, serve_demo=not no_serve)


@data_app.command("corpus")
def data_corpus(out: Annotated[Path, typer.Option(help="Output JSONL file.")] = Path("corpus.jsonl"),
                max_docs: Annotated[int, typer.Option(help="Cap on records (0 = all).")] = 0) -> None:
    """Generate the built-in corpus from the Python standard library's documentation."""
    from tinystack.pipeline import stage_corpus

    cfg = Config()
    cfg.data.corpus_max_docs = max_docs
    stage_corpus(cfg, out)


@data_app.command("prepare")
def data_prepare(input: Annotated[list[Path], typer.Option("--input", "-i", help="JSONL file or text folder (repeatable).")],
                 out: Annotated[Path, typer.Option(help="Output directory.")], config: ConfigOpt = None,
                 set_: SetOpt = None) -> None:
    """Normalise, filter, exact-dedup and split into train/val/test.jsonl + manifest.json."""
    from tinystack.pipeline import stage_data

    for p in input:
        if not p.exists():
            raise FileNotFoundError(f"input not found: {p}")
    stage_data(_cfg(config, set_), input, out)


@tok_app.command("train")
def tokenizer_train(data: Annotated[Path, typer.Option(help="Directory with train/val/test.jsonl.")],
                    out: Annotated[Path, typer.Option(help="Output directory (tokenizer.json + *.bin).")],
                    config: ConfigOpt = None, set_: SetOpt = None) -> None:
    """Train byte-level BPE on train.jsonl and encode every split to a token file."""
    from tinystack.pipeline import stage_tokenizer

    stage_tokenizer(_cfg(config, set_), data, out)


@app.command()
def train(tokens: Annotated[Path, typer.Option(help="Tokenizer directory with train.bin/val.bin.")],
          out: Annotated[Path, typer.Option(help="Model directory to write.")], config: ConfigOpt = None,
          set_: SetOpt = None) -> None:
    """Train the PyTorch GPT on token files and write a model directory."""
    from tinystack.pipeline import stage_train
    from tinystack.tokenizer import BPETokenizer

    tok = BPETokenizer.load(tokens)
    stage_train(_cfg(config, set_), tokens, out, out.parent / f"{out.name}_train_log.jsonl",
                {"tokenizer_hash": tok.fingerprint()})


@app.command("eval")
def eval_(model: Annotated[Path, typer.Option(help="Model directory.")],
          tokens: Annotated[Path, typer.Option(help="Directory with val.bin/test.bin.")],
          out: Annotated[Path, typer.Option(help="Where to write eval.json.")] = Path("eval.json"),
          config: ConfigOpt = None, set_: SetOpt = None) -> None:
    """Loss, perplexity and bits per byte on the val and test token files."""
    from tinystack.pipeline import stage_eval

    stage_eval(_cfg(config, set_), model, tokens, out)


@app.command()
def generate(model: Annotated[Path, typer.Option(help="Model directory.")],
             prompt: Annotated[str, typer.Option(help="Prompt text.")],
             max_tokens: int = 64, temperature: float = 0.8, top_k: int = 0, top_p: float = 1.0,
             seed: Optional[int] = None, device: str = "cpu") -> None:
    """Generate a continuation, streaming it to the terminal."""
    from tinystack.infer import Engine, SamplingParams

    engine = Engine.from_dir(model, device=device)
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    sys.stdout.write(prompt)
    emitted: list[int] = []
    shown = ""

    def stream(token_id: int) -> None:  # decode the whole tail so multi-byte characters print whole
        nonlocal shown
        emitted.append(token_id)
        text = engine.tokenizer.decode(emitted)
        if not text.endswith("\ufffd"):
            sys.stdout.write(text[len(shown):])
            sys.stdout.flush()
            shown = text

    g = engine.generate(prompt, params, on_token=stream)
    sys.stdout.write(g.text[len(shown):] + "\n")
    typer.echo(f"[{len(g.token_ids)} tokens, finish_reason={g.finish_reason}, prefill {g.prefill_s * 1e3:.1f} ms, "
               f"decode {g.decode_s * 1e3:.1f} ms]", err=True)


@app.command()
def serve(model: Annotated[Path, typer.Option(help="Model directory.")], config: ConfigOpt = None, set_: SetOpt = None,
          host: Optional[str] = None, port: Optional[int] = None,
          log: Annotated[Optional[Path], typer.Option(help="Request log (JSONL).")] = None) -> None:
    """Serve POST /generate and GET /health with uvicorn."""
    from tinystack.infer import Engine
    from tinystack.observe import setup_request_log
    from tinystack.serve import create_app, serve_forever

    cfg = _cfg(config, set_)
    engine = Engine.from_dir(model, device=cfg.run.device)
    request_log = setup_request_log(log, stream=None if log else sys.stderr)
    try:
        serve_forever(create_app(engine, cfg.serve, request_log=request_log), host or cfg.serve.host,
                      port if port is not None else cfg.serve.port)
    finally:
        request_log.close()


@app.command()
def bench(model: Annotated[Path, typer.Option(help="Model directory.")],
          prompt_tokens: int = 64, new_tokens: int = 64, device: str = "cpu",
          out: Annotated[Optional[Path], typer.Option(help="Write the figures as JSON here.")] = None) -> None:
    """Decode speed with the KV cache vs recomputing the whole sequence every token."""
    from tinystack.infer.bench import kv_cache_speedup

    result = kv_cache_speedup(model, prompt_tokens=prompt_tokens, new_tokens=new_tokens, device=device)
    typer.echo(json.dumps(result, indent=2))
    if out:
        from tinystack.atomic import write_json

        write_json(out, result)


def main() -> None:
    try:
        app()
    except (ConfigError, FileNotFoundError, ValueError) as e:
        if os.environ.get("TINYSTACK_DEBUG"):
            raise
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
