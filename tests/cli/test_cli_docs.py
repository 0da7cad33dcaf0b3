"""Every `tinystack ...` command line written in README.md, BENCHMARKS.md, docs/*.md and the source's docstrings
names a command that exists and only flags that command has (a renamed flag or a removed command must not live on
in the docs)."""
import re
from pathlib import Path

import pytest
import typer

from tinystack.cli import app

ROOT = Path(__file__).resolve().parents[2]
CLI = typer.main.get_command(app)


def _command_lines(text: str):
    """Inline `tinystack ...` spans, and the lines of code blocks that run tinystack (continuations joined)."""
    yield from re.findall(r"`(tinystack [^`]+)`", text)
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            start = line.find("tinystack ")
            if start >= 0 and (line.lstrip().startswith("tinystack ") or " -m tinystack " in line):
                yield re.split(r"\s#\s|\s{2,}#", line[start:])[0]


def _flags(command) -> set[str]:
    return {o for p in command.params for o in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ()))}


def _problem(line: str) -> str | None:
    words = re.sub(r"[\[\]|]", " ", line).split()[1:]
    command, path = CLI, []
    while words and hasattr(command, "commands") and words[0] in command.commands:
        command = command.commands[words[0]]
        path.append(words.pop(0))
    if not path:
        return "no such command"
    known = _flags(command)
    if hasattr(command, "commands"):
        if words and words[0] == "...":  # `tinystack data ... --input`: any subcommand's flag
            known |= {f for sub in command.commands.values() for f in _flags(sub)}
        elif not command.invoke_without_command:
            return f"{' '.join(path)} needs one of its subcommands {sorted(command.commands)}"
    unknown = [w.split("=")[0] for w in words if w.startswith("--") and w.split("=")[0] not in known]
    return f"{' '.join(path)} has no {unknown}" if unknown else None


FILES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md")),
         *sorted((ROOT / "src").rglob("*.py"))]
LINES = [(f.relative_to(ROOT), line) for f in FILES for line in _command_lines(f.read_text(encoding="utf-8"))]


def test_the_docs_hold_command_lines_to_check():
    assert len(LINES) > 30
    assert any("hash-key" in line for _, line in LINES)


@pytest.mark.parametrize("where, line", LINES, ids=[f"{w}: {line[:60]}" for w, line in LINES])
def test_a_documented_command_line_exists(where, line):
    assert _problem(line) is None, f"{where}: {line!r}: {_problem(line)}"


def test_the_check_can_fail():
    assert _problem("tinystack serve --hash-key") == "serve has no ['--hash-key']"
    assert _problem("tinystack bench latency").startswith("bench needs one of its subcommands")
    assert _problem("tinystack deploy") == "no such command"
    assert _problem("tinystack bench --model m").startswith("bench needs one of its subcommands")
