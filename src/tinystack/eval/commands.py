"""`tinystack eval`: offline metrics of a model directory, and `tinystack eval regress`, the regression gate.

    tinystack eval --model DIR --data DIR [--tokens DIR] [--out eval.json]
    tinystack eval regress --model NEW --baseline OLD --cases FILE [--regression-tolerance 0.02] [--data DIR]

`app` is a typer group whose callback is the plain `eval` (it runs when no
subcommand is given); the CLI mounts it with `app.add_typer(eval_app, name="eval")`.
`regress` exits 1 when a case or the mean loss regresses beyond tolerance, so it
can gate CI or a deploy. Both take the [eval] keys as flags (`--max-windows`, `--threads`,
`--regression-tolerance`, ...; tinystack.cli_options) and `--device` (run.device).
`models_app` is `tinystack models list | show | promote | rollback` over the registry in
`run.registry` (`--registry DIR`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tinystack.cli_options import config_command
from tinystack.config import Config
from tinystack.errors import UserError

app = typer.Typer(add_completion=False, help="Offline metrics of a model directory; `regress` gates on a case file.")


@app.callback(invoke_without_command=True)
@config_command("eval", "run.device", "run.threads")
def evaluate(cfg: Config, ctx: typer.Context,
             model: Annotated[Path | None, typer.Option(help="Model directory.")] = None,
             data: Annotated[Path | None, typer.Option(help="Data directory with {train,val,test}.jsonl: "
                                                       "per-source/length slices, bad cases, leakage.")] = None,
             tokens: Annotated[Path | None, typer.Option(
                 help="Directory with val.bin/test.bin (else the JSONL splits are encoded in memory).")] = None,
             out: Annotated[Path, typer.Option(help="Where to write eval.json.")] = Path("eval.json")) -> None:
    """Loss, perplexity, bits per byte and accuracy per split; per source and length with --data."""
    if ctx.invoked_subcommand is not None:
        return
    if model is None or (data is None and tokens is None):
        raise UserError("give --model and --data (and/or --tokens)")
    from tinystack.eval.stage import stage_eval

    stage_eval(cfg, model, tokens, out, data)


@app.command()
@config_command("eval", "run.device", "run.threads")
def regress(cfg: Config, model: Annotated[Path, typer.Option(help="Model directory under test (NEW).")],
            cases: Annotated[Path, typer.Option(help="Regression set: JSONL of cases.")],
            baseline: Annotated[Path | None, typer.Option(help="Model directory to compare with (OLD).")] = None,
            data: Annotated[Path | None, typer.Option(
                help="Data directory: also gate on val/test bits per byte.")] = None,
            metric_tolerance: Annotated[float, typer.Option(help="Bits/byte a split may worsen.")] = 0.01,
            out: Annotated[Path | None, typer.Option(help="Write the full comparison as JSON here.")] = None) -> None:
    """Run the cases on NEW and BASELINE (none: NEW alone); print what got better and worse; exit 1 on a
    regression (a case worse by more than --regression-tolerance)."""
    from tinystack.atomic import write_json
    from tinystack.eval.gate import run_regression
    from tinystack.eval.regression import load_cases
    from tinystack.eval.show import print_regression
    from tinystack.eval.threads import torch_threads
    from tinystack.progress import console

    with torch_threads(cfg.run.threads):
        result = run_regression(model, load_cases(cases), baseline, tolerance=cfg.eval.regression_tolerance,
                                device=cfg.run.device, data_dir=data, metric_tolerance=metric_tolerance,
                                eval_cfg=cfg.eval)
    print_regression(console, result)
    if out is not None:
        write_json(out, result)
    if result["summary"]["regressed"]:
        raise typer.Exit(1)


models_app = typer.Typer(no_args_is_help=True,
                         help="The model registry: promoted models per name, and which is current.")


def _registry(cfg: Config):
    from tinystack.eval.registry import ModelRegistry

    return ModelRegistry(cfg.run.registry)


@models_app.command("list")
@config_command("run.registry")
def models_list(cfg: Config) -> None:
    """Every name with its current version and how many versions it holds."""
    reg = _registry(cfg)
    names = reg.names()
    if not names:
        typer.echo(f"no models in {reg.root}")
    for name in names:
        idx = reg.index(name)
        cur = reg.record(name) if idx["current"] else {}
        typer.echo(f"{name}\tcurrent {idx['current'] or '-'}\t{len(reg.versions(name))} versions\t"
                   f"model {str(cur.get('model_sha256') or '-')[:12]}\tfrom {cur.get('source', '-')}")


@models_app.command("show")
@config_command("run.registry")
def models_show(cfg: Config, name: str,
                version: Annotated[str | None, typer.Option(help="Default: the current one.")] = None) -> None:
    """A version's lineage record (JSON) and the promotion history."""
    import json

    reg = _registry(cfg)
    idx = reg.index(name)
    typer.echo(json.dumps({"current": idx["current"], "promotions": idx["promotions"],
                           "versions": reg.versions(name), "record": reg.record(name, version)}, indent=2))


@models_app.command("promote")
@config_command("run.registry")
def models_promote(cfg: Config, name: str, version: str) -> None:
    """Make VERSION of NAME current by hand (the gate is `tinystack run`; this is the operator's override)."""
    reg = _registry(cfg)
    reg.promote(name, version)
    typer.echo(f"{name}: {version} is current")


@models_app.command("rollback")
@config_command("run.registry")
def models_rollback(cfg: Config, name: str) -> None:
    """Make the previously promoted version of NAME current again."""
    reg = _registry(cfg)
    typer.echo(f"{name}: rolled back to {reg.rollback(name)}")
