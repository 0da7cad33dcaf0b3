"""DDP: `torchrun --nproc_per_node=2 -m tinystack train` (gloo, CPU) == one process on the combined batch."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from train_helpers import tokens

from tinystack.cli import main
from tinystack.tokenizer import CharTokenizer
from tinystack.tokenizer.shards import write_token_file

TORCHRUN = Path(sys.executable).with_name("torchrun")


def _token_dir(tmp: Path) -> Path:
    tok = CharTokenizer.train(["abcdefghijklmn"])  # 14 chars + 2 specials = the 16 ids of the token stream
    d = tmp / "tok"
    tok.save(d)
    data = tokens(vocab=16)
    for split in ("train", "val"):
        write_token_file(data, tok, d / f"{split}.bin", n_bytes=len(data), docs=1, source="test")
    return d


def _run(cmd: list[str], tmp: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _train_here(args: list[str], tmp: Path, monkeypatch) -> None:
    """`tinystack train ARGS` in this process, on one torch thread as each torchrun rank runs: the single-process
    references need no interpreter of their own (the DDP run above is the subprocess that matters)."""
    monkeypatch.chdir(tmp)
    monkeypatch.setattr(sys, "argv", ["tinystack", "train", *args, "--set", "run.threads=1"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code in (0, None)


@pytest.mark.slow  # two torch processes + gloo: ~25 s idle, ~45 s on the loaded 2-core machine
def test_one_ddp_step_on_2_processes_equals_one_step_on_the_combined_batch(tmp_path, monkeypatch):
    tok_dir = _token_dir(tmp_path)
    common = ["--tokens", str(tok_dir), "--set", "model.n_layer=1", "--set", "model.n_head=2",
              "--set", "model.n_embd=16", "--set", "model.context_length=8", "--set", "train.max_iters=1",
              "--set", "train.dtype=float64",
              "--set", "train.warmup_iters=0", "--set", "train.eval_interval=100", "--set", "train.eval_iters=1",
              "--set", "train.plot=false", "--set", "train.seed=0", "--set", "train.learning_rate=0.01"]
    _run([str(TORCHRUN), "--standalone", "--nproc_per_node=2", "-m", "tinystack", "train", *common,
          "--out", str(tmp_path / "ddp"), "--set", "train.batch_size=4"], tmp_path)
    _train_here([*common, "--out", str(tmp_path / "single"), "--set", "train.batch_size=8"], tmp_path, monkeypatch)
    ddp = load_file(str(tmp_path / "ddp/model.safetensors"))
    single = load_file(str(tmp_path / "single/model.safetensors"))
    assert ddp.keys() == single.keys()
    for name in ddp:
        # float64 training (saved as float32): Adam's first step is ~lr * sign(g), so a gradient that is pure
        # rounding noise (the attention key bias has none in exact arithmetic) would flip signs in float32
        np.testing.assert_allclose(ddp[name], single[name], rtol=0, atol=1e-7, err_msg=name)
    # and the comparison can fail: one process on half of the batch gives a different step
    _train_here([*common, "--out", str(tmp_path / "half"), "--set", "train.batch_size=4"], tmp_path, monkeypatch)
    half = load_file(str(tmp_path / "half/model.safetensors"))
    assert max(np.abs(half[n] - single[n]).max() for n in half) > 1e-4
