"""Config-backed command options: every command gets `--config FILE.toml`, repeatable `--set section.key=value`
and, for the config fields it names, one flag per field, generated from tinystack.config.

    @config_command("serve", "infer", "run.device")     # whole sections, or single section.key fields
    def serve(cfg: Config, model: Path, log: Path | None = None) -> None: ...

The decorated function takes the resolved `Config` as its first parameter instead of the
flags: defaults < the file < `--set` < flags given on the command line. A field's flag has
the field's name with dashes (`infer.max_num_seqs` -> `--max-num-seqs`, a bool `x` ->
`--x/--no-x`), its help is the field's comment in config.py, and its value goes through the
same type check as the file (tinystack.config), so a `Literal` field rejects a bad flag
value with the allowed values named. Options that are per call rather than configuration
(a prompt, an output path) stay plain parameters of the command.
"""
from __future__ import annotations

import functools
import inspect
import re
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.markup import escape  # help is rendered as rich markup: "[otel]" must stay text

from tinystack.config import Config, load_config
from tinystack.errors import UserError

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="TOML config file.")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override: section.key=value (repeatable).")]


@functools.cache
def _field_comments() -> dict[str, str]:
    """{"infer.kv_cache": "contiguous: one whole-context block per sequence", ...}: the comment after each field
    in config.py, so a flag's help and the config file's documentation are one text. Read once, line by line
    (inspect.getsource per class cost more, paid by every command at start-up)."""
    section_of = {cls.__name__: name for name, cls in typing.get_type_hints(Config).items()}
    out: dict[str, str] = {}
    section = None
    for line in Path(inspect.getfile(Config)).read_text(encoding="utf-8").splitlines():
        if line.startswith("class "):
            section = section_of.get(line[6:].split("(")[0].rstrip(":"))
        elif section and (m := re.match(r"    (\w+): [^#]*#\s*(.*)$", line)):
            out[f"{section}.{m[1]}"] = m[2]
    return out


def config_fields(*keys: str) -> list[tuple[str, str, Any]]:
    """[(section, name, type)] for "section" (every field) or "section.name" (one field) keys."""
    hints = typing.get_type_hints(Config)
    out = []
    for key in keys:
        section, _, name = key.partition(".")
        types = typing.get_type_hints(hints[section])
        out += [(section, n, types[n]) for n in ([name] if name else types)]
    return out


def _flag(section: str, name: str, typ: Any, comment: str) -> inspect.Parameter:
    help_ = f"{section}.{name}" + (f": {comment}" if comment else "")
    if typing.get_origin(typ) is Literal:  # checked by the config (one line naming the choices), not by click
        choices = typing.get_args(typ)
        typ, help_ = str, f"{help_} (one of: {', '.join(repr(c) if c == '' else c for c in choices)})"
    elif typing.get_origin(typ) is list:
        help_ = f"{help_} (repeatable)"
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Annotated[typ | None, typer.Option(help=escape(help_))])


def check_device(device: str) -> None:
    """A UserError unless torch can use `device` here (e.g. "cuda" on a machine without CUDA)."""
    if device == "cpu":
        return
    # deferred: only a device other than cpu needs torch; `--help` and config errors must not wait for it
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise UserError(f"run.device: {e}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"run.device={device!r}: CUDA is not available on this machine (use cpu)")
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise UserError(f"run.device={device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"run.device={device!r}: MPS is not available on this machine (use cpu)")


def config_command(*keys: str, defaults: dict[str, Any] | None = None) -> Callable[[Callable[..., Any]],
                                                                                   Callable[..., Any]]:
    """Decorator: `fn(cfg, **rest)` becomes a typer command with --config, --set and a flag per field in `keys`;
    `defaults` ({"section.key": value}, from config.py) are the command's own starting values."""
    fields = config_fields(*keys)
    comments = _field_comments()

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        own = list(inspect.signature(fn, eval_str=True).parameters.values())[1:]  # without `cfg`
        clash = {p.name for p in own} & {name for _, name, _ in fields}
        if clash:
            raise TypeError(f"{fn.__name__}: parameters {sorted(clash)} clash with config flags")
        params = own + [inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ConfigOpt),
                        inspect.Parameter("set_", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=SetOpt)]
        params += [_flag(s, n, t, comments.get(f"{s}.{n}", "")) for s, n, t in fields]

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            given = {f"{s}.{n}": kwargs.pop(n) for s, n, _ in fields}
            cfg = load_config(kwargs.pop("config"), kwargs.pop("set_") or [],
                              {k: v for k, v in given.items() if v is not None}, defaults)
            check_device(cfg.run.device)
            return fn(cfg, **kwargs)

        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate

