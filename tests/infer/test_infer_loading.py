"""Model directories end to end: our checkpoint + BPE tokenizer.json through `tokenizers`, the CLI, INT8."""
from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from tinystack.infer import LLM, SamplingParams
from tinystack.infer.quant.linear import QuantLinear, quantize_model
from tinystack.model import GPT, GPTConfig, save_model
from tinystack.tokenizer import BPETokenizer, load_tokenizer

TEXT = ["def generate(prompt, params):\n    return engine.run(prompt) + 'héllo ✓'\n"] * 20


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("ours")
    tok = BPETokenizer.train(TEXT, vocab_size=300)
    tok.save(d)
    torch.manual_seed(4)
    save_model(GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=2, n_head=2, n_embd=32)), d,
               eos_token_id=tok.eos_token_id)
    return d


def test_one_tokenizer_path_matches_our_bpe(model_dir):
    ours, loaded = BPETokenizer.load(model_dir), load_tokenizer(model_dir)
    for text in TEXT[:1] + ["<|endoftext|> is text here", "ünïcode ✓ 123"]:
        assert loaded.encode_ordinary(text) == ours.encode_ordinary(text)
        assert loaded.decode(ours.encode_ordinary(text)) == text
    assert loaded.eos_token_id == ours.eos_token_id


def test_llm_batch_equals_each_prompt_alone_from_a_model_directory(model_dir):
    """The batched engine and an unbatched one (max_num_seqs=1, one prompt at a time) give the same tokens."""
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = ["def generate(", "héllo", ""]
    out = LLM(model_dir, weight_format="float32", memory_limit_mb=1024, max_num_seqs=4).generate(prompts, params)
    single = LLM(model_dir, weight_format="float32", memory_limit_mb=1024, max_num_seqs=1)
    for o, p in zip(out, prompts):
        alone = single.generate([p], params)[0]
        assert o.token_ids == alone.token_ids
        assert o.text == single.tokenizer.decode(o.token_ids)
    assert out[2].prompt_token_ids == [single.tokenizer.eos_token_id]  # an empty prompt starts from EOS


def test_generate_cli_streams_the_continuation(model_dir):
    import typer

    from tinystack.infer.commands import generate

    app = typer.Typer()
    app.command()(generate)
    res = CliRunner().invoke(app, ["--model", str(model_dir), "--prompt", "def ", "--max-tokens", "8",
                                   "--temperature", "0", "--ignore-eos"])
    assert res.exit_code == 0, res.output
    want = LLM(model_dir, memory_limit_mb=1024, max_num_seqs=1).generate(
        ["def "], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    assert res.stdout.startswith("def " + want.text)
    assert "finish_reason=length" in res.output


@pytest.mark.parametrize("flags", [["--speculative", "prompt_lookup"],
                                   ["--speculative", "draft", "--draft-model", "{model_dir}"]],
                         ids=["prompt_lookup", "draft"])
def test_generate_cli_speculates_from_infer_flags(model_dir, flags):
    """[infer] speculative through `tinystack generate`: the greedy text of plain decoding, acceptance reported."""
    import typer

    from tinystack.infer.commands import generate

    app = typer.Typer()
    app.command()(generate)
    prompt = "def generate(prompt, params):\n    return engine.run(prompt)\ndef generate("
    args = ["--model", str(model_dir), "--prompt", prompt, "--max-tokens", "16", "--temperature", "0", "--ignore-eos",
            "--weight-format", "float32"]
    plain = CliRunner().invoke(app, args)
    spec = CliRunner().invoke(app, args + [f.format(model_dir=model_dir) for f in flags])
    assert plain.exit_code == spec.exit_code == 0, spec.output
    assert spec.stdout == plain.stdout
    assert "speculative drafts accepted" in spec.output and "speculative" not in plain.output


def test_q8_0_weights_are_a_quarter_and_close(model_dir):
    from tinystack.model import load_model

    model = load_model(model_dir)
    q = load_model(model_dir)
    report = quantize_model(q, "q8_0")
    assert report["layers"] == 2 * 4 + 1 and sum(isinstance(m, QuantLinear) for m in q.modules()) == 9  # + the head
    assert report["bytes_after"] < 0.27 * report["bytes_before"]  # 34 bytes per 32 weights instead of 128
    idx = torch.randint(0, model.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = model(idx)[0], q(idx)[0]  # 40 prefill rows
        a1, b1 = model(idx[:1, :1])[0], q(idx[:1, :1])[0]  # one decode row
    for x, y in ((a, b), (a1, b1)):
        assert (x - y).abs().max() < 0.05 * x.abs().max()
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    out = LLM(model_dir, weight_format="q8_0", memory_limit_mb=1024, max_num_seqs=2).generate(["def "], greedy)[0]
    assert len(out.token_ids) == 8


def test_generate_cli_refuses_a_prompt_over_the_context_in_one_line(model_dir):
    import typer

    from tinystack.errors import UserError
    from tinystack.infer.commands import generate

    app = typer.Typer()
    app.command()(generate)
    res = CliRunner().invoke(app, ["--model", str(model_dir), "--prompt", "def generate(prompt) " * 40])
    # a UserError: the CLI's main prints it as one "error: ..." line and exits 2 (tests/cli/test_cli_errors.py)
    assert isinstance(res.exception, UserError)
    assert str(res.exception).startswith("--prompt: ") and "the model's context is 64 tokens" in str(res.exception)
