"""The pipeline's tokenizer and train stages: char-level + position split, both backends, PNG curve, resume."""
import json
import math

import numpy as np
import torch

from tinystack.config import load_config
from tinystack.model.io import load_model
from tinystack.tokenizer import CharTokenizer, load_tokenizer
from tinystack.tokenizer.shards import load_tokens
from tinystack.tokenizer.stage import stage_tokenizer
from tinystack.train.stage import stage_train

PARAGRAPHS = ["To be, or not to be, that is the question:", "Whether 'tis nobler in the mind to suffer",
              "The slings and arrows of outrageous fortune,", "Or to take arms against a sea of troubles"]


def _data_dir(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    records = [{"text": p * 8} for p in PARAGRAPHS] * 5
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (d / "val.jsonl").write_text("")
    (d / "test.jsonl").write_text("")
    return d


def _cfg(*extra):
    return load_config(None, ["tokenizer.kind=char", "tokenizer.position_split=0.1", "model.n_layer=1",
                              "model.n_head=2", "model.n_embd=16", "model.context_length=16", "train.max_iters=30",
                              "train.batch_size=4", "train.eval_interval=10", "train.eval_iters=2",
                              "train.warmup_iters=2", "train.learning_rate=0.01", *extra])


def test_char_tokenizer_stage_splits_by_position(tmp_path):
    info = stage_tokenizer(_cfg(), _data_dir(tmp_path), tmp_path / "tok")
    tok = load_tokenizer(tmp_path / "tok")
    assert info["kind"] == "char" and tok.fingerprint() == CharTokenizer.load(tmp_path / "tok").fingerprint()
    train, val = load_tokens(tmp_path / "tok/train.bin"), load_tokens(tmp_path / "tok/val.bin")
    total = info["train_tokens"] + info["val_tokens"]
    assert info["val_tokens"] == total - int(total * 0.9) and info["test_tokens"] == 0
    whole = "\n\n".join(p * 8 for p in PARAGRAPHS * 5)
    assert tok.decode(np.concatenate([train, val]).tolist()) == whole  # the text, cut once, nothing lost


def test_train_stage_both_backends_write_loadable_model_dirs_and_a_png(tmp_path):
    data = _data_dir(tmp_path)
    stage_tokenizer(_cfg(), data, tmp_path / "tok")
    for backend in ("torch", "numpy"):
        cfg = _cfg(f"train.backend={backend}")
        info = stage_train(cfg, tmp_path / "tok", tmp_path / backend, tmp_path / f"{backend}.jsonl", {"x": 1})
        model = load_model(tmp_path / backend)  # the model directory format, whichever backend wrote it
        assert model.config.vocab_size == load_tokenizer(tmp_path / backend).vocab_size
        assert info["final_val_loss"] < math.log(model.config.vocab_size)
        assert (tmp_path / f"{backend}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "torch_checkpoints" / "last.pt").is_file()


def test_train_stage_resume_finishes_a_longer_run(tmp_path):
    data = _data_dir(tmp_path)
    stage_tokenizer(_cfg(), data, tmp_path / "tok")
    stage_train(_cfg("train.max_iters=20"), tmp_path / "tok", tmp_path / "a", tmp_path / "a.jsonl", {})
    # a 30-step config resumed from a 20-step checkpoint: the last 10 steps run, on the 30-step schedule
    resumed = stage_train(_cfg(), tmp_path / "tok", tmp_path / "a", tmp_path / "a.jsonl", {}, resume=True)
    assert resumed["resumed_from"] == 20 and resumed["steps"] == 30
    steps = [json.loads(line)["step"] for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert steps == list(range(30))
    assert all(torch.isfinite(p).all() for p in load_model(tmp_path / "a").parameters())
