"""`tinystack serve`: the HTTP server with uvicorn (wired into the CLI by tinystack.cli)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from tinystack.cli_options import ConfigOpt, SetOpt, resolve_config


def serve(model: Annotated[Path, typer.Option(help="Model directory.")], config: ConfigOpt = None, set_: SetOpt = None,
          host: Optional[str] = None, port: Optional[int] = None,
          log: Annotated[Optional[Path], typer.Option(help="Request log (JSONL); default stderr.")] = None) -> None:
    """Serve POST /generate and GET /health with uvicorn."""
    from tinystack.infer import Engine
    from tinystack.observe import setup_request_log
    from tinystack.serve import create_app, serve_forever

    cfg = resolve_config(config, set_)
    engine = Engine.from_dir(model, device=cfg.run.device)
    request_log = setup_request_log(log, stream=None if log else sys.stderr)
    try:
        serve_forever(create_app(engine, cfg.serve, request_log=request_log), host or cfg.serve.host,
                      port if port is not None else cfg.serve.port)
    finally:
        request_log.close()
