"""The typed config: TOML, then overrides; typos and wrong types are errors, never ignored."""
from pathlib import Path

import pytest

from tinystack.config import Config, ConfigError, load_config

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
