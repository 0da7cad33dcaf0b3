"""`tinystack eval`: offline metrics of a model directory, and `tinystack eval regress`, the regression gate.

    tinystack eval --model DIR --data DIR [--tokens DIR] [--out eval.json]
    tinystack eval regress --model NEW --baseline OLD --cases FILE [--tolerance 0.05] [--data DIR] [--out FILE]

`app` is a typer group whose callback is the plain `eval` (it runs when no
subcommand is given); the CLI mounts it with `app.add_typer(eval_app, name="eval")`.
`regress` exits 1 when a case or the mean loss regresses beyond tolerance, so it
can gate CI or a deploy.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tinystack.cli_options import ConfigOpt, SetOpt, resolve_config

app = typer.Typer(add_completion=False, help="Offline metrics of a model directory; `regress` gates on a case file.")


@app.callback(invoke_without_command=True)
def evaluate(ctx: typer.Context,
             model: Annotated[Optional[Path], typer.Option(help="Model directory.")] = None,
             data: Annotated[Optional[Path], typer.Option(
                 help="Data directory with {train,val,test}.jsonl: per-source/length slices, bad cases, leakage.")] = None,
             tokens: Annotated[Optional[Path], typer.Option(
                 help="Directory with val.bin/test.bin (else the JSONL splits are encoded in memory).")] = None,
             out: Annotated[Path, typer.Option(help="Where to write eval.json.")] = Path("eval.json"),
             config: ConfigOpt = None, set_: SetOpt = None) -> None:
    """Loss, perplexity, bits per byte and accuracy per split; per source and length with --data."""
    if ctx.invoked_subcommand is not None:
        return
    if model is None or (data is None and tokens is None):
        raise typer.BadParameter("give --model and --data (and/or --tokens)")
    from tinystack.eval.stage import stage_eval

    stage_eval(resolve_config(config, set_), model, tokens, out, data)


@app.command()
def regress(model: Annotated[Path, typer.Option(help="Model directory under test (NEW).")],
            cases: Annotated[Path, typer.Option(help="Regression set: JSONL of cases.")],
            baseline: Annotated[Optional[Path], typer.Option(help="Model directory to compare with (OLD).")] = None,
            tolerance: Annotated[Optional[float], typer.Option(
                help="Nats/token a score may worsen (default: [eval] regression_tolerance).")] = None,
            data: Annotated[Optional[Path], typer.Option(
                help="Data directory: also gate on val/test bits per byte.")] = None,
            metric_tolerance: Annotated[float, typer.Option(help="Bits/byte a split may worsen.")] = 0.01,
            out: Annotated[Optional[Path], typer.Option(help="Write the full comparison as JSON here.")] = None,
            config: ConfigOpt = None, set_: SetOpt = None) -> None:
    """Run the cases on NEW and BASELINE; print what got better and worse; exit 1 on a regression."""
    from tinystack.atomic import write_json
    from tinystack.eval.gate import run_regression
    from tinystack.eval.regression import load_cases
    from tinystack.eval.show import print_regression
    from tinystack.eval.threads import torch_threads
    from tinystack.progress import console

    cfg = resolve_config(config, set_)
    tol = cfg.eval.regression_tolerance if tolerance is None else tolerance
    with torch_threads(cfg.eval.threads):
        result = run_regression(model, load_cases(cases), baseline, tolerance=tol, device=cfg.run.device,
                                data_dir=data, metric_tolerance=metric_tolerance, eval_cfg=cfg.eval)
    print_regression(console, result)
    if out is not None:
        write_json(out, result)
    if result["summary"]["regressed"]:
        raise typer.Exit(1)


models_app = typer.Typer(no_args_is_help=True, help="The model registry: promoted models per name, and which is current.")
RegistryOpt = Annotated[Optional[Path], typer.Option(help="Registry directory (default: run.registry).")]


def _registry(registry: Path | None, config: Path | None, set_: list[str] | None):
    from tinystack.eval.registry import ModelRegistry

    return ModelRegistry(registry or resolve_config(config, set_).run.registry)


@models_app.command("list")
def models_list(registry: RegistryOpt = None, config: ConfigOpt = None, set_: SetOpt = None) -> None:
    """Every name with its current version and how many versions it holds."""
    reg = _registry(registry, config, set_)
    names = reg.names()
    if not names:
        typer.echo(f"no models in {reg.root}")
    for name in names:
        idx = reg.index(name)
        cur = reg.record(name) if idx["current"] else {}
        typer.echo(f"{name}\tcurrent {idx['current'] or '-'}\t{len(reg.versions(name))} versions\t"
                   f"model {str(cur.get('model_sha256') or '-')[:12]}\tfrom {cur.get('source', '-')}")


@models_app.command("show")
def models_show(name: str, version: Annotated[Optional[str], typer.Option(help="Default: the current one.")] = None,
                registry: RegistryOpt = None, config: ConfigOpt = None, set_: SetOpt = None) -> None:
    """A version's lineage record (JSON) and the promotion history."""
    import json

    reg = _registry(registry, config, set_)
    idx = reg.index(name)
    typer.echo(json.dumps({"current": idx["current"], "promotions": idx["promotions"],
                           "versions": reg.versions(name), "record": reg.record(name, version)}, indent=2))


@models_app.command("promote")
def models_promote(name: str, version: str, registry: RegistryOpt = None, config: ConfigOpt = None,
                   set_: SetOpt = None) -> None:
    """Make VERSION of NAME current by hand (the gate is `tinystack run`; this is the operator's override)."""
    reg = _registry(registry, config, set_)
    reg.promote(name, version)
    typer.echo(f"{name}: {version} is current")


@models_app.command("rollback")
def models_rollback(name: str, registry: RegistryOpt = None, config: ConfigOpt = None, set_: SetOpt = None) -> None:
    """Make the previously promoted version of NAME current again."""
    reg = _registry(registry, config, set_)
    typer.echo(f"{name}: rolled back to {reg.rollback(name)}")
