"""`UserError`: a mistake the user can fix (a bad config value, a device that is not there, a run that diverged).

The layers raise it (or a subclass: `tinystack.config.ConfigError`,
`tinystack.train.loop.NonFiniteLossError`) with a message that says what is wrong and,
where it helps, what to do; the command line (tinystack.cli.main) prints that message as
one line and exits with status 2, never a traceback.
"""
from __future__ import annotations


class UserError(Exception):
    """An error the user caused and can fix; its message is one line, shown as-is by the CLI."""
