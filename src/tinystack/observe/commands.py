"""`tinystack cost --log FILE`: what each API key's requests cost, from the server's request log.

Wired into the CLI by tinystack.cli as a top-level command: `app.command("cost")(cost)`.
Reads the "request" lines of one or more JSONL request logs (`tinystack serve --log`),
totals them per key id (the first 12 hex digits of the key's SHA-256, never the key)
and prints a table: requests (failed), tokens, device seconds, CPU seconds, cost and
cost per 1,000 tokens (see tinystack.observe.cost for the basis).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tinystack.cli_options import config_command
from tinystack.config import Config


@config_command()  # --config / --set like every command; the costs were priced when the requests were served
def cost(cfg: Config,
         log: Annotated[list[Path], typer.Option(help="Request log (JSONL); repeat for several.", exists=True,
                                                 dir_okay=False)],
         as_json: Annotated[bool, typer.Option("--json", help="Print the totals as JSON instead.")] = False,
         key: Annotated[str | None, typer.Option(help="Only this key id.")] = None) -> None:
    """Cost per API key from request logs: requests, tokens, device/CPU seconds, USD, USD per 1k tokens."""
    from itertools import chain

    from rich.console import Console
    from rich.table import Table

    from tinystack.observe.cost import read_log, summarize_log

    totals = summarize_log(chain.from_iterable(read_log(p) for p in log))
    if key is not None:
        totals = [t for t in totals if t.key_id == key]
    if as_json:
        typer.echo(json.dumps([{**vars(t), "tokens": t.tokens, "cost_per_1k_tokens": t.cost_per_1k_tokens}
                               for t in totals], indent=2))
        return
    table = Table(title=f"Cost per API key ({sum(t.requests for t in totals)} requests)")
    for name in ("key id", "requests", "failed", "prompt tok", "output tok", "device s", "CPU s", "cost USD",
                 "USD / 1k tok"):
        table.add_column(name, justify="left" if name == "key id" else "right")
    for t in totals:
        per_1k = t.cost_per_1k_tokens
        table.add_row(t.key_id, str(t.requests), str(t.failed), str(t.prompt_tokens), str(t.completion_tokens),
                      f"{t.device_s:.3f}", f"{t.cpu_s:.3f}", f"{t.cost_usd:.6f}",
                      "-" if per_1k is None else f"{per_1k:.6f}")
    Console().print(table)
