"""User errors on the command line: one line on stderr, exit status 2, no traceback; and `tinystack hash-key`, which
reads the key from stdin or a hidden prompt, never from argv.

The checks run `tinystack.cli.main` in-process, as the console entry point does (argv in, SystemExit out), so no
test pays a fresh interpreter's torch import per error. Two stay real subprocesses, where the process is what is
tested: `python -m tinystack` refusing a prompt after the engine started (its exit must not abort while the
KV-prefault thread runs) and hash-key's hidden prompt on a pseudo-terminal."""
import hashlib
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tinystack.tokenizer import CharTokenizer
from tinystack.tokenizer.shards import write_token_file

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cli(monkeypatch, run_cli):
    """run(*args, stdin="") -> (exit status, stdout, stderr) of `tinystack ARGS` in-process (conftest.run_cli).
    A server that would start serving instead of refusing fails the test rather than blocking it."""

    def no_server(*a, **k):
        raise AssertionError("the server started: the error was not caught before serving")

    monkeypatch.setattr("tinystack.serve.serve_forever", no_server)

    def run(*args: str, stdin: str = "") -> tuple[int, str, str]:
        proc = run_cli(*args, stdin=stdin)
        return proc.returncode, proc.stdout, proc.stderr

    return run


def assert_one_line_error(result, *expected: str) -> None:
    """`result`: (status, stdout, stderr) from `cli`, or a CompletedProcess."""
    if isinstance(result, subprocess.CompletedProcess):
        result = (result.returncode, result.stdout, result.stderr)
    code, _, stderr = result
    assert code == 2, (code, stderr[-3000:])
    assert "Traceback" not in stderr, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and stderr.rstrip("\n").endswith(errors[0]), stderr[-3000:]
    for text in expected:
        assert text in errors[0], errors[0]


@pytest.fixture(scope="module")
def token_dir(tmp_path_factory) -> Path:
    """A char tokenizer and train/val token files (14 characters + 2 specials: ids 0-15)."""
    d = tmp_path_factory.mktemp("tok")
    tok = CharTokenizer.train(["abcdefghijklmn"])
    tok.save(d)
    data = np.tile(np.arange(16, dtype=np.uint16), 250)
    for split in ("train", "val"):
        write_token_file(data, tok, d / f"{split}.bin", n_bytes=len(data), docs=1, source="test")
    return d


TINY_TRAIN = ["--n-layer", "1", "--n-head", "1", "--n-embd", "16", "--context-length", "8", "--batch-size", "4",
              "--eval-interval", "100", "--eval-iters", "1", "--no-plot"]


def test_a_diverging_run_stops_with_one_line_naming_the_step(cli, token_dir, tmp_path):
    result = cli("train", "--tokens", token_dir, "--out", tmp_path / "m", *TINY_TRAIN, "--max-iters", "50",
                 "--learning-rate", "1e30", "--min-lr", "1e29", "--grad-clip", "1e30")
    assert_one_line_error(result, "error: loss became", "at step", "train.learning_rate")
    assert not (tmp_path / "m" / "model.safetensors").exists()


@pytest.mark.parametrize("args", [["generate", "--model", "m", "--prompt", "x"], ["serve", "--model", "m"],
                                  ["train", "--tokens", "t", "--out", "o"], ["run", "--no-serve"]])
def test_a_device_that_is_not_there_is_one_line(cli, args):
    """cuda:99 exists nowhere (with or without CUDA); the check runs before any file is read."""
    assert_one_line_error(cli(*args, "--device", "cuda:99"), "run.device='cuda:99'")


def test_cuda_on_a_machine_without_it_is_one_line(cli):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: covered by the cuda:99 test")
    assert_one_line_error(cli("generate", "--model", "m", "--prompt", "x", "--device", "cuda"),
                          "CUDA is not available")


@pytest.mark.parametrize("args, expected", [
    (["generate", "--model", "m", "--prompt", "x", "--kv-cache", "pagd"],
     "--kv-cache: infer.kv_cache: expected one of 'paged', 'contiguous', got 'pagd'"),
    (["serve", "--model", "m", "--set", "infer.scheduler=eager"],
     "infer.scheduler: expected one of 'continuous', 'dynamic', got 'eager'"),
    (["bench", "serve", "--model", "m", "--weight-format", "int4"],
     "infer.weight_format: expected one of 'auto', 'float32', 'bfloat16', 'bf16', 'q8_0', 'q4_0', 'q4_1'"),
    (["train", "--tokens", "t", "--out", "o", "--dtype", "float8"], "train.dtype: expected one of 'float32'"),
    (["data", "split", "-i", "x", "--out", "o", "--split-by", "random"], "data.split_by: expected one of 'source'"),
    (["bench", "kv", "--model", "m", "--set", "serve.port=http"], "serve.port: expected int"),
    (["cost", "--log", "pyproject.toml", "--set", "nope.x=1"], "unknown section [nope]"),
    (["hash-key", "--set", "tokenizer.kind=word"], "tokenizer.kind: expected one of 'bpe', 'char'"),
    (["eval", "--model", "m", "--tokens", "t", "--set", "run.device=cuda:99"], "run.device='cuda:99'"),
])
def test_bad_values_are_one_line_naming_what_is_allowed(cli, monkeypatch, args, expected):
    monkeypatch.chdir(ROOT)  # "pyproject.toml" above is the repository's
    assert_one_line_error(cli(*args), expected)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from tinystack.model import GPT, GPTConfig
    from tinystack.model.io import save_model

    d = tmp_path_factory.mktemp("model")
    tok = CharTokenizer.train(["abcdefghijklmn"])
    save_model(GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=1, n_head=1, n_embd=8)), d,
               eos_token_id=tok.eos_token_id)
    tok.save(d)
    return d


def test_serve_and_generate_refuse_a_bad_key_file_generation_config_or_template_at_once(cli, model_dir, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("not-a-hash\n")
    assert_one_line_error(cli("serve", "--model", model_dir, "--port", "0", "--api-key-file", keys),
                          "keys.txt:1: expected a hex SHA-256")
    bad = tmp_path / "bad_model"
    shutil.copytree(model_dir, bad)
    (bad / "generation_config.json").write_text('{"temperature": 7}')
    assert_one_line_error(cli("serve", "--model", bad, "--port", "0"),
                          "generation_config.json: temperature must be in [0.0, 2.0], got 7")
    assert_one_line_error(cli("generate", "--model", bad, "--prompt", "abc"),  # generate reads it too
                          "generation_config.json: temperature must be in [0.0, 2.0], got 7")
    (bad / "generation_config.json").unlink()
    (bad / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}")
    assert_one_line_error(cli("serve", "--model", bad, "--port", "0"), "chat template does not parse (line 1)")


def test_usage_mistakes_inside_a_command_are_one_line(cli, model_dir, tmp_path):
    """Checked in the command's body (not by the option parser): still one line, not click's framed box."""
    assert_one_line_error(cli("generate", "--model", model_dir), "give exactly one of --prompt and --chat")
    bad = tmp_path / "tpl"
    shutil.copytree(model_dir, bad)
    (bad / "chat_template.jinja").write_text("{% for m in messages %}")
    assert_one_line_error(cli("generate", "--model", bad, "--chat", "hi"), "--chat: chat template does not parse")
    assert_one_line_error(cli("generate", "--model", model_dir, "--prompt", "abcd" * 20),
                          "--prompt: prompt is 80 tokens; the model's context is 16 tokens")
    assert_one_line_error(cli("eval", "--model", model_dir), "give --model and --data (and/or --tokens)")
    assert_one_line_error(cli("bench", "serve"), "give exactly one of --url and --model")


def test_the_real_command_refuses_a_prompt_after_the_engine_started_with_one_line(model_dir):
    """`python -m tinystack` as a user runs it: the error reaches the console as one line and exit status 2, also
    when the refusal comes after the engine started its KV-prefault thread (exiting while that thread was inside
    a C++ call once aborted the process: SIGABRT instead of exit 2; three runs at once, as it was a race)."""
    args = [sys.executable, "-m", "tinystack", "generate", "--model", str(model_dir), "--prompt", "abcd" * 20]
    procs = [subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"}) for _ in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert_one_line_error((p.returncode, out, err),
                              "--prompt: prompt is 80 tokens; the model's context is 16 tokens")


def test_hash_key_reads_keys_from_stdin_one_per_line(cli):
    code, out, err = cli("hash-key", stdin="first-key\n  second-key \n\n")
    assert code == 0, err
    sha = [hashlib.sha256(k.encode()).hexdigest() for k in ("first-key", "second-key")]
    assert out.splitlines() == sha  # surrounding blanks dropped, as the server drops them
    assert_one_line_error(cli("hash-key", stdin="\n"), "no API key given")


def test_hash_key_refuses_a_key_on_the_command_line(cli):
    code, out, err = cli("hash-key", "my-secret")
    assert code == 2 and out == ""
    assert hashlib.sha256(b"my-secret").hexdigest() not in err


def _read_until_exit(fd: int, prompt: bytes, answer: bytes, timeout_s: float = 60) -> bytes:
    """Everything the child writes to its terminal; `answer` is typed once `prompt` has appeared."""
    seen, deadline, typed = b"", time.monotonic() + timeout_s, False
    while time.monotonic() < deadline:
        if not select.select([fd], [], [], 0.5)[0]:
            continue
        try:
            chunk = os.read(fd, 1024)
        except OSError:  # EIO: the child exited and the terminal closed
            break
        if not chunk:
            break
        seen += chunk
        if not typed and prompt in seen:
            os.write(fd, answer)
            typed = True
    return seen


def test_hash_key_prompts_on_a_terminal_without_echoing_the_key():
    pid, fd = pty.fork()
    if pid == 0:  # the child: its stdin/stdout are the pseudo-terminal, as in an interactive shell
        os.chdir(ROOT)
        os.execv(sys.executable, [sys.executable, "-m", "tinystack", "hash-key"])
    try:
        seen = _read_until_exit(fd, b"API key", b"typed-secret\n")
    finally:
        os.close(fd)
        for _ in range(100):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.1)
        else:  # still running 10 s after the read ended: hung
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, seen
    assert hashlib.sha256(b"typed-secret").hexdigest().encode() in seen, seen
    assert b"typed-secret" not in seen  # the terminal never showed the key
