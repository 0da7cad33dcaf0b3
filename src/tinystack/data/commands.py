"""`tinystack data ...`: the data layer's subcommands (wired into the CLI by tinystack.cli).

    corpus      build the built-in corpus (stdlib docstrings) as JSONL
    normalize   read any input format, normalise, write JSONL/Parquet
    filter      normalise + quality filters (length in words, charset, symbols,
                repetition, perplexity with --perplexity-reference)
    dedup       exact + MinHash-LSH near dedup: kept / duplicates, with cluster_id
    split       split by source or time, then remove cross-split near duplicates
    prepare     the whole chain from the [data] config section (+ --set overrides)

Every command shows a progress bar (docs/s) and ends with a summary table.
Field mapping (--text-field content --source-field url ...) works for JSONL, CSV
and Parquet inputs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from tinystack.cli_options import ConfigOpt, SetOpt, resolve_config

app = typer.Typer(no_args_is_help=True, help="Build, clean, filter, dedup and split data.")

InputOpt = Annotated[list[Path], typer.Option("--input", "-i", help="Input file or text folder (repeatable).")]
TextField = Annotated[Optional[str], typer.Option(help="Input field holding the text.")]
SourceField = Annotated[Optional[str], typer.Option(help="Input field holding the source.")]
IdField = Annotated[Optional[str], typer.Option(help="Input field holding the id.")]
Workers = Annotated[Optional[int], typer.Option(help="Processes for MinHash signatures.")]
Engine = Annotated[Optional[str], typer.Option(help="local | ray")]
Address = Annotated[Optional[str], typer.Option(help="Ray address: local | auto | ray://host:port")]
Progress = Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar.")]


def _config(config: Path | None, set_: list[str] | None, **overrides: Any) -> Any:
    """The [data] section: defaults < config file < --set < explicit options."""
    d = resolve_config(config, set_).data
    for k, v in overrides.items():
        if v is not None:
            setattr(d, k, v)
    return d


def _show(summary: dict[str, Any], title: str) -> None:
    from rich.console import Console

    from tinystack.data.report import summary_table

    Console().print(summary_table(summary, title))


@app.command("corpus")
def corpus(out: Annotated[Path, typer.Option(help="Output JSONL file.")] = Path("corpus.jsonl"),
           max_docs: Annotated[int, typer.Option(help="Cap on records (0 = all).")] = 0) -> None:
    """Generate the built-in corpus from the Python standard library's documentation."""
    from tinystack.data.stage import stage_corpus

    cfg = resolve_config(None, None)
    cfg.data.corpus_max_docs = max_docs
    stage_corpus(cfg, out)


@app.command("normalize")
def normalize(input: InputOpt, out: Annotated[Path, typer.Option(help="Output .jsonl or .parquet file.")],
              text_field: TextField = None, source_field: SourceField = None, id_field: IdField = None,
              config: ConfigOpt = None, set_: SetOpt = None, progress: Progress = True) -> None:
    """Normalise text (NFC, line endings, whitespace) and convert to JSONL/Parquet."""
    from tinystack.data.options import field_map
    from tinystack.data.tools import normalize_files

    d = _config(config, set_, text_field=text_field, source_field=source_field, id_field=id_field)
    _show(normalize_files(input, out, fields=field_map(d), progress=progress), f"normalize -> {out}")


@app.command("filter")
def filter_(input: InputOpt, out: Annotated[Path, typer.Option(help="Output .jsonl or .parquet file.")],
            perplexity_reference: Annotated[Optional[list[Path]], typer.Option(help="Reference text for the char LM (repeatable).")] = None,
            perplexity_percentile: Annotated[Optional[float], typer.Option(help="Cut above this held-out percentile.")] = None,
            min_words: Annotated[Optional[int], typer.Option(help="Minimum words (CJK chars count as words).")] = None,
            text_field: TextField = None, source_field: SourceField = None, id_field: IdField = None,
            config: ConfigOpt = None, set_: SetOpt = None, progress: Progress = True) -> None:
    """Quality filters: words, charset, symbols/digits, repetition, perplexity."""
    from tinystack.data.filters.quality import QualityParams
    from tinystack.data.options import field_map, quality_params
    from tinystack.data.tools import filter_files

    d = _config(config, set_, text_field=text_field, source_field=source_field, id_field=id_field,
                min_words=min_words, perplexity_percentile=perplexity_percentile,
                perplexity_reference=[str(p) for p in perplexity_reference] if perplexity_reference else None)
    d.quality = True
    q = quality_params(d) or QualityParams()
    _show(filter_files(input, out, q, fields=field_map(d), progress=progress), f"filter -> {out}")


@app.command("dedup")
def dedup(input: InputOpt, out: Annotated[Path, typer.Option(help="Output directory.")],
          threshold: Annotated[Optional[float], typer.Option(help="Jaccard threshold for near duplicates.")] = None,
          num_perm: Annotated[Optional[int], typer.Option(help="MinHash permutations.")] = None,
          k: Annotated[Optional[int], typer.Option("--k", help="Shingle size.")] = None,
          unit: Annotated[Optional[str], typer.Option(help="Shingle unit: char | word.")] = None,
          format: Annotated[str, typer.Option(help="Output format: jsonl | parquet.")] = "jsonl",
          workers: Workers = None, engine: Engine = None, address: Address = None,
          text_field: TextField = None, source_field: SourceField = None, id_field: IdField = None,
          config: ConfigOpt = None, set_: SetOpt = None, progress: Progress = True) -> None:
    """Exact + near dedup: OUT/kept.jsonl, OUT/duplicates.jsonl (with cluster_id), OUT/dedup.json."""
    from tinystack.data.options import field_map, near_dup_params
    from tinystack.data.tools import dedup_files

    if format not in ("jsonl", "parquet"):
        raise typer.BadParameter("--format must be jsonl or parquet")
    d = _config(config, set_, dedup_threshold=threshold, num_perm=num_perm, shingle_k=k, shingle_unit=unit,
                workers=workers, engine=engine, ray_address=address, text_field=text_field,
                source_field=source_field, id_field=id_field)
    summary = dedup_files(input, out, near_dup_params(d), fields=field_map(d), workers=d.workers, engine=d.engine,
                          ray_address=d.ray_address, fmt=format, progress=progress)
    _show(summary, f"dedup -> {out} ({summary['clusters']:,} clusters, dedup rate {summary['dedup_rate']:.2%})")


@app.command("split")
def split(input: InputOpt, out: Annotated[Path, typer.Option(help="Output directory.")],
          by: Annotated[Optional[str], typer.Option(help="source | time")] = None,
          val_fraction: Annotated[Optional[float], typer.Option()] = None,
          test_fraction: Annotated[Optional[float], typer.Option()] = None,
          val_from: Annotated[Optional[str], typer.Option(help="ISO cutoff (by time).")] = None,
          test_from: Annotated[Optional[str], typer.Option(help="ISO cutoff (by time).")] = None,
          text_field: TextField = None, source_field: SourceField = None, id_field: IdField = None,
          config: ConfigOpt = None, set_: SetOpt = None, progress: Progress = True) -> None:
    """Split by source or time (never random) and remove cross-split near duplicates."""
    from tinystack.data.options import field_map, prepare_kwargs
    from tinystack.data.tools import split_files

    d = _config(config, set_, split_by=by, val_fraction=val_fraction, test_fraction=test_fraction,
                val_from=val_from, test_from=test_from, text_field=text_field, source_field=source_field,
                id_field=id_field)
    kw = {k: v for k, v in prepare_kwargs(d).items() if k in ("split_by", "val_fraction", "test_fraction",
                                                              "val_from", "test_from", "fields", "leakage")}
    _show(split_files(input, out, progress=progress, **kw), f"split -> {out}")


@app.command("prepare")
def prepare(input: InputOpt, out: Annotated[Path, typer.Option(help="Output directory.")],
            workers: Workers = None, engine: Engine = None, address: Address = None,
            text_field: TextField = None, source_field: SourceField = None, id_field: IdField = None,
            config: ConfigOpt = None, set_: SetOpt = None, progress: Progress = True) -> None:
    """The whole chain (normalise, filter, dedup, split, leakage) into train/val/test.jsonl + manifest.json."""
    from tinystack.data.stage import stage_data

    for p in input:
        if not p.exists():
            raise FileNotFoundError(f"input not found: {p}")
    cfg = resolve_config(config, set_)
    for key, v in dict(workers=workers, engine=engine, ray_address=address, text_field=text_field,
                       source_field=source_field, id_field=id_field).items():
        if v is not None:
            setattr(cfg.data, key, v)
    stage_data(cfg, input, out, progress=progress)
