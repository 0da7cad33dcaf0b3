"""Options every subcommand shares: `--config FILE.toml` and repeatable `--set section.key=value`."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tinystack.config import Config, load_config

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="TOML config file.")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="Override: section.key=value (repeatable).")]


def resolve_config(config: Path | None, overrides: list[str] | None) -> Config:
    """Defaults, then the file, then the overrides (see tinystack.config.load_config)."""
    return load_config(config, overrides or [])
