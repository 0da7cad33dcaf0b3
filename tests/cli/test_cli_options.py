"""Flags <-> config: every command takes --config and --set; every other flag is either generated from a config
field (same name, that field's help) or a per-call option on the list below; a flag beats --set beats the file."""
import dataclasses
import typing

import pytest
import typer
from typer.testing import CliRunner

from tinystack.cli import app
from tinystack.cli_options import config_command
from tinystack.config import Config

# Options that are per call, not configuration: inputs and outputs of one run, sampling of one prompt, load-test
# shape. A new flag must either be a config field (config_command) or be added here on purpose.
PER_CALL = {
    "help", "config", "set_", "input", "out", "model", "data", "tokens", "cases", "prompt", "log", "log_level",
    "no_serve", "progress", "format", "resume", "ckpt_dir", "metric_tolerance", "max_tokens", "temperature", "top_k",
    "top_p", "min_p", "seed", "stop", "repetition_penalty", "presence_penalty", "frequency_penalty", "min_tokens",
    "ignore_eos",
    "prompt_tokens", "new_tokens", "url", "concurrency", "requests", "rate", "max_seconds", "api_key", "plot",
    "as_json", "key", "no_promote", "baseline", "version", "chat", "system",
    "json_schema", "regex", "choice", "grammar",  # generate's output constraint (infer/structured)
}
SHADOWING = {"seed": "generate's sampling seed, not train.seed", "plot": "bench serve's PNG path, not train.plot"}
SECTIONS = {name: {f.name for f in dataclasses.fields(cls)} for name, cls in typing.get_type_hints(Config).items()}


def _commands(group, path: tuple[str, ...] = ()):
    if hasattr(group, "commands"):  # a group (typer carries its own copy of click: no isinstance)
        if group.callback is not None and path:  # `eval` runs on its own too
            yield path, group
        for name, sub in group.commands.items():
            yield from _commands(sub, (*path, name))
    else:
        yield path, group


COMMANDS = list(_commands(typer.main.get_command(app)))


def test_the_walk_finds_every_command():
    names = {" ".join(p) for p, _ in COMMANDS}
    assert names == {"run", "data corpus", "data normalize", "data filter", "data dedup", "data split", "data prepare",
                     "model import", "tokenizer train", "train", "finetune", "eval", "eval regress", "models list",
                     "models show",
                     "models promote", "models rollback", "generate", "serve", "cost", "hash-key", "bench kv",
                     "bench serve"}


@pytest.mark.parametrize("path, command", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_flag_is_a_config_field_or_per_call(path, command):
    opts = {p.name: p for p in command.params if isinstance(p, typer.core.TyperOption)}
    assert "--config" in opts["config"].opts and "--set" in opts["set_"].opts
    for name, opt in opts.items():
        if name in PER_CALL:
            assert name in SHADOWING or not any(name in fields for fields in SECTIONS.values()), (
                f"{' '.join(path)} --{name}: a hand-written flag with a config key's name")
            continue
        section = (opt.help or "").split(".", 1)[0]
        assert section in SECTIONS and name in SECTIONS[section], f"{' '.join(path)}: --{name} maps to no config key"
        assert opt.help.startswith(f"{section}.{name}")
        assert opt.opts[0] == "--" + name.replace("_", "-")  # the same name, dashes for underscores


def test_serve_exposes_every_serve_and_infer_key():
    serve = dict(COMMANDS)[("serve",)]
    names = {p.name for p in serve.params}
    assert SECTIONS["serve"] <= names and SECTIONS["infer"] <= names and "device" in names


def _probe(*keys):
    seen = {}

    @config_command(*keys)
    def probe(cfg: Config, out: str = "x") -> None:
        seen["cfg"], seen["out"] = cfg, out

    probe_app = typer.Typer()
    probe_app.command()(probe)
    probe_app.command("other")(lambda: None)  # two commands: `probe` stays a named subcommand
    return probe_app, seen


def test_a_flag_beats_set_which_beats_the_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[infer]\nmax_num_seqs = 3\nkv_cache = "contiguous"\nweight_format = "bfloat16"\n')
    probe_app, seen = _probe("infer", "run.device")
    res = CliRunner().invoke(probe_app, ["probe", "--config", str(path), "--set", "infer.max_num_seqs=5",
                                         "--set", "infer.kv_cache=paged", "--max-num-seqs", "7",
                                         "--no-enable-prefix-caching", "--out", "y"])
    assert res.exit_code == 0, res.output
    cfg = seen["cfg"]
    assert cfg.infer.max_num_seqs == 7  # flag > --set > file
    assert cfg.infer.kv_cache == "paged"  # --set > file
    assert cfg.infer.weight_format == "bfloat16"  # file > default
    assert cfg.infer.enable_prefix_caching is False and seen["out"] == "y"
    assert cfg.run.device == "cpu"


def test_a_flag_not_given_leaves_the_file_and_list_fields_alone(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[data]\nscripts = ["cjk"]\nquality = false\n')
    probe_app, seen = _probe("data.scripts", "data.quality")
    assert CliRunner().invoke(probe_app, ["probe", "--config", str(path)]).exit_code == 0
    assert seen["cfg"].data.scripts == ["cjk"] and seen["cfg"].data.quality is False
    assert CliRunner().invoke(probe_app, ["probe", "--scripts", "latin", "--scripts", "cjk"]).exit_code == 0
    assert seen["cfg"].data.scripts == ["latin", "cjk"]


def test_flags_that_clash_with_a_parameter_are_refused_at_definition():
    with pytest.raises(TypeError, match="clash"):
        @config_command("infer")
        def bad(cfg: Config, weight_format: str = "x") -> None: ...


def test_literal_flags_show_their_choices_in_help():
    res = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "300"})
    assert "infer.kv_cache" in res.output and "(one of: paged, contiguous)" in res.output
    assert "(one of: '', console, otlp)" in res.output and "[otel]" in res.output  # not eaten as markup
