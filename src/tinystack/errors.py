"""`UserError`: a mistake the user can fix (a bad config value, a device that is not there, a run that diverged).

The layers raise it (or a subclass: `tinystack.config.ConfigError`,
`tinystack.train.loop.NonFiniteLossError`) with a message that says what is wrong and,
where it helps, what to do; the command line (tinystack.cli.main) prints that message as
one line and exits with status 2, never a traceback.
"""
from __future__ import annotations

import importlib


class UserError(Exception):
    """An error the user caused and can fix; its message is one line, shown as-is by the CLI."""


class MissingExtra(UserError):
    """An optional dependency is not installed: the message names the feature and the extra that brings it."""


def require(module: str, extra: str, feature: str):
    """Import `module` (an optional dependency from the `[extra]` extra) for `feature`, or raise MissingExtra
    saying how to install it: the one way a command that needs an extra reports its absence."""

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtra(f"{feature} needs the [{extra}] extra: pip install -e '.[{extra}]' "
                           f"(from the tinystack checkout; {e})") from None
