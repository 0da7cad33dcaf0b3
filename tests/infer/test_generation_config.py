"""A model directory's sampling defaults (model/generation_config.py): the fields vLLM reads from
generation_config.json, checked against SamplingParams' ranges, one line naming the file and field when bad."""
import json

import pytest
import torch

from tinystack.model.generation_config import sampling_defaults


def _dir(tmp_path, config):
    (tmp_path / "generation_config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return tmp_path


def test_the_sampling_fields_are_read_and_the_rest_ignored(tmp_path):
    d = _dir(tmp_path, {"bos_token_id": 1, "eos_token_id": [2, 3], "do_sample": True, "temperature": 0.6,
                        "top_p": 0.9, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.05, "max_length": 4096})
    got = sampling_defaults(d)
    assert got == {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.05}
    assert isinstance(got["top_k"], int) and isinstance(got["temperature"], float)


def test_no_file_none_or_null_values_give_no_defaults(tmp_path):
    assert sampling_defaults(None) == {} and sampling_defaults(tmp_path) == {}
    assert sampling_defaults(_dir(tmp_path, {"temperature": None, "top_k": -1, "top_p": 1})) == {"top_k": 0,
                                                                                                 "top_p": 1.0}


@pytest.mark.parametrize("config, message", [
    ({"temperature": "0.7"}, "temperature must be a number, got '0.7'"),
    ({"temperature": True}, "temperature must be a number, got True"),
    ({"temperature": 2.5}, "temperature must be in [0.0, 2.0], got 2.5"),
    ({"top_p": 0}, "top_p must be in (0.0, 1.0], got 0"),
    ({"top_k": 2.5}, "top_k must be a number (whole), got 2.5"),
    ({"top_k": -2}, "top_k must be >= -1, got -2"),
    ({"repetition_penalty": 0}, "repetition_penalty must be in [0.01, 10.0], got 0"),
    ("[1, 2]", "expected a JSON object"),
    ("{not json", "cannot read it"),
])
def test_a_bad_value_is_one_line_naming_the_file_and_field(tmp_path, config, message):
    with pytest.raises(ValueError) as e:
        sampling_defaults(_dir(tmp_path, config))
    assert "generation_config.json: " in str(e.value) and message in str(e.value) and "\n" not in str(e.value)


def _tiny_model_dir(d):
    from tinystack.model import GPT, GPTConfig
    from tinystack.model.io import save_model
    from tinystack.tokenizer import CharTokenizer

    tok = CharTokenizer.train(["abcdefghijklmn "])
    torch.manual_seed(0)
    save_model(GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_head=1, n_embd=16)), d,
               eos_token_id=tok.eos_token_id)
    tok.save(d)
    return d


def test_generate_takes_the_models_sampling_unless_a_flag_sets_it(tmp_path):
    from typer.testing import CliRunner

    from tinystack.cli import app

    d = _tiny_model_dir(tmp_path)

    def generate(*flags):
        res = CliRunner().invoke(app, ["generate", "--model", str(d), "--prompt", "abc", "--max-tokens", "16",
                                       "--ignore-eos", "--set", "infer.weight_format=float32", *flags])
        assert res.exit_code == 0, res.output
        return res.stdout.splitlines()[-1] if res.stdout.strip() else "", res.output

    sampled = {generate("--seed", str(s))[0] for s in range(4)}  # no generation_config.json: the CLI's 0.8
    assert len(sampled) > 1
    _dir(tmp_path, {"temperature": 0.0})
    runs = [generate("--seed", str(s)) for s in range(4)]
    assert len({text for text, _ in runs}) == 1  # the model's greedy, whatever the seed
    assert "sampling from the model's generation_config.json: temperature=0.0" in runs[0][1]
    assert runs[0][0] == generate("--temperature", "0")[0]
    assert len({generate("--temperature", "0.8", "--seed", str(s))[0] for s in range(4)}) > 1  # a flag wins


def test_llm_uses_the_models_sampling_when_given_no_params(tmp_path):
    from tinystack.infer import LLM, SamplingParams

    d = _dir(_tiny_model_dir(tmp_path), {"temperature": 0.0, "top_k": 5})
    llm = LLM(d, weight_format="float32")
    defaults = llm.get_default_sampling_params()  # vLLM's name
    assert (defaults.temperature, defaults.top_k, defaults.top_p) == (0.0, 5, 1.0)
    greedy = llm.generate("abc", SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))[0].token_ids
    runs = {tuple(llm.generate("abc")[0].token_ids) for _ in range(3)}  # no params: the model's greedy
    assert len(runs) == 1 and list(next(iter(runs))) == greedy[:len(next(iter(runs)))]
