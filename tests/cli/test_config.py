"""The typed config: TOML, then overrides; typos and wrong types are errors, never ignored."""
import dataclasses
import typing
from pathlib import Path

import pytest

from tinystack.config import FINETUNE_DEFAULTS, RENAMED, Config, ConfigError, DataConfig, InferConfig, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("name", ["default.toml", "smoke.toml", "shakespeare-char.toml"])
def test_shipped_configs_load(name):
    assert isinstance(load_config(CONFIGS / name), Config)


def test_file_then_overrides(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[train]\nmax_iters = 7\nlearning_rate = 1\n[data]\ninputs = ["a.jsonl"]\n')
    cfg = load_config(path, ["train.max_iters=9", "serve.timeout_s=2.5", 'run.device="cpu"', "data.split_by=time"])
    assert cfg.train.max_iters == 9
    assert cfg.train.learning_rate == 1.0 and isinstance(cfg.train.learning_rate, float)  # int widens to float
    assert cfg.serve.timeout_s == 2.5
    assert cfg.data.inputs == ["a.jsonl"]
    assert cfg.data.split_by == "time"  # a bare word is taken as a string


@pytest.mark.parametrize("text, msg", [
    ("[trian]\nmax_iters = 1\n", r"unknown section \[trian\]"),
    ("[train]\nmax_itres = 1\n", "unknown key train.max_itres"),
    ('[train]\nmax_iters = "many"\n', "train.max_iters: expected int"),
    ("[train]\nmax_iters = true\n", "train.max_iters: expected int"),
    ("[data]\ninputs = [1]\n", r"data.inputs\[0\]: expected str"),
    ("[train\n", "invalid TOML"),
])
def test_bad_files_are_clear_errors(tmp_path, text, msg):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=msg):
        load_config(path)


def test_bad_overrides_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="expected section.key=value"):
        load_config(None, ["max_iters=3"])
    with pytest.raises(ConfigError, match="expected float"):
        load_config(None, ["train.learning_rate=fast"])
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.toml")


def _literal_fields():
    for section, cls in typing.get_type_hints(Config).items():
        for name, typ in typing.get_type_hints(cls).items():
            if typing.get_origin(typ) is typing.Literal:
                yield f"{section}.{name}", typing.get_args(typ), getattr(getattr(Config(), section), name)


LITERALS = list(_literal_fields())


def test_fixed_choice_fields_are_literals():
    names = {name for name, _, _ in LITERALS}
    assert {"infer.kv_cache", "infer.scheduler", "infer.weight_format", "infer.runtime", "train.dtype",
            "train.backend", "tokenizer.kind", "data.split_by", "data.shingle_unit", "data.engine",
            "serve.otel_exporter"} <= names
    for name, allowed, default in LITERALS:
        assert default in allowed, name


@pytest.mark.parametrize("name, allowed, default", LITERALS, ids=[n for n, _, _ in LITERALS])
def test_every_choice_is_accepted_and_anything_else_refused_naming_the_choices(tmp_path, name, allowed, default):
    section, key = name.split(".")
    for value in allowed:
        assert getattr(getattr(load_config(None, [f'{name}="{value}"']), section), key) == value
    listed = ", ".join(map(repr, allowed))
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"{name}=bogus"])
    assert str(e.value) == f"override '{name}=bogus': {name}: expected one of {listed}, got 'bogus'"
    path = tmp_path / "c.toml"
    path.write_text(f"[{section}]\n{key} = 3\n")
    with pytest.raises(ConfigError, match=rf"{name}: expected one of .*, got 3$"):
        load_config(path)
    with pytest.raises(ConfigError, match=rf"^--{key.replace('_', '-')}: {name}: expected one of"):
        load_config(None, [], {name: "bogus"})


def test_the_old_serve_engine_keys_are_gone_and_point_nowhere():
    """max_num_seqs has one home ([infer]); serve.batching is infer.scheduler / infer.max_num_seqs=1."""
    for key in ("serve.max_num_seqs=4", "serve.batching=dynamic", "infer.max_batch=4"):
        with pytest.raises(ConfigError, match="unknown key"):
            load_config(None, [key])


def test_a_flag_names_one_key_on_every_command():
    """Flags are generated from bare field names, so a name in two sections would make `--x` one key on `train`
    and another on `serve` (as --block-size and --dtype once did): every field name is in one section only."""
    owner: dict[str, str] = {}
    for section in dataclasses.fields(Config):
        for f in dataclasses.fields(getattr(Config(), section.name)):
            assert f.name not in owner, f"{owner[f.name]}.{f.name} and {section.name}.{f.name} are both --{f.name}"
            owner[f.name] = section.name


@pytest.mark.parametrize("old, new", sorted(RENAMED.items()))
def test_an_old_key_is_an_error_naming_the_new_one(tmp_path, old, new):
    section, key = old.split(".")
    path = tmp_path / "old.toml"
    path.write_text(f"[{section}]\n{key} = 1\n")
    for load in (lambda: load_config(path), lambda: load_config(None, [f"{old}=1"]),
                 lambda: load_config(None, [], {old: 1})):
        with pytest.raises(ConfigError, match=rf"{old} is now {new}$"):
            load()
    assert new.split(".")[1] in {f.name for f in dataclasses.fields(getattr(Config(), new.split(".")[0]))}


def test_a_section_built_in_python_checks_its_values_as_a_file_does():
    with pytest.raises(ConfigError, match="infer.weight_format: expected one of"):
        InferConfig(weight_format="int8")
    with pytest.raises(ConfigError, match="data.min_chars: expected int"):
        DataConfig(min_chars="many")
    assert InferConfig(memory_buffer=1).memory_buffer == 1.0  # an int widens to the float field, as in a file


def test_finetune_starts_from_its_own_defaults_then_the_usual_order(tmp_path):
    cfg = load_config(None, ["train.learning_rate=1e-3"], defaults=FINETUNE_DEFAULTS)
    assert cfg.train.max_iters == FINETUNE_DEFAULTS["train.max_iters"] != Config().train.max_iters
    assert cfg.train.learning_rate == 1e-3  # --set wins over the command's defaults
    assert cfg.data.val_fraction == FINETUNE_DEFAULTS["data.val_fraction"]
