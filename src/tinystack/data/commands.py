"""`tinystack data ...`: the data layer's subcommands (wired into the CLI by tinystack.cli)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tinystack.cli_options import ConfigOpt, SetOpt, resolve_config

app = typer.Typer(no_args_is_help=True, help="Build, clean, dedup and split data.")


@app.command("corpus")
def corpus(out: Annotated[Path, typer.Option(help="Output JSONL file.")] = Path("corpus.jsonl"),
           max_docs: Annotated[int, typer.Option(help="Cap on records (0 = all).")] = 0) -> None:
    """Generate the built-in corpus from the Python standard library's documentation."""
    from tinystack.pipeline import stage_corpus

    cfg = resolve_config(None, None)
    cfg.data.corpus_max_docs = max_docs
    stage_corpus(cfg, out)


@app.command("prepare")
def prepare(input: Annotated[list[Path], typer.Option("--input", "-i", help="JSONL file or text folder (repeatable).")],
            out: Annotated[Path, typer.Option(help="Output directory.")], config: ConfigOpt = None,
            set_: SetOpt = None) -> None:
    """Normalise, filter, exact-dedup and split into train/val/test.jsonl + manifest.json."""
    from tinystack.pipeline import stage_data

    for p in input:
        if not p.exists():
            raise FileNotFoundError(f"input not found: {p}")
    stage_data(resolve_config(config, set_), input, out)
