"""Training's final validation loss is `tinystack eval`'s: the same checkpoint and split give the same number.

A tiny model is trained by the train stage (what `tinystack train` runs) on a char-level token directory, then
the eval stage (what `tinystack eval` runs) scores the model directory it wrote. Both go through
eval.scoring.score_batches on the same windows, so the numbers agree to 1e-6 while the periodic estimates
(a different, smaller subset of windows) are allowed to differ.
"""
import json

import pytest

from tinystack.config import load_config
from tinystack.eval.stage import stage_eval
from tinystack.tokenizer.stage import stage_tokenizer
from tinystack.train.stage import stage_train

TEXT = ["To be, or not to be, that is the question:", "Whether 'tis nobler in the mind to suffer",
        "The slings and arrows of outrageous fortune,", "Or to take arms against a sea of troubles"]


@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_final_val_loss_equals_eval_json(tmp_path, backend):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("".join(json.dumps({"text": p * 8}) + "\n" for p in TEXT * 5))
    for split in ("val", "test"):
        (data / f"{split}.jsonl").write_text("")
    # eval thins the val windows to 20 in batches of 16; training's estimates use 2 x 4 others
    cfg = load_config(None, ["tokenizer.kind=char", "tokenizer.position_split=0.1", "model.n_layer=1",
                             "model.n_head=2", "model.n_embd=16", "model.context_length=16", "train.max_iters=12",
                             "train.batch_size=4", "train.eval_interval=5", "train.eval_iters=2",
                             "train.warmup_iters=2", "train.learning_rate=0.01", "train.plot=false",
                             f"train.backend={backend}", "eval.max_windows=20", "eval.windows_per_batch=16",
                             "eval.gen_max_tokens=4", "eval.gen_prompts=['To be']"])
    stage_tokenizer(cfg, data, tmp_path / "tok")
    info = stage_train(cfg, tmp_path / "tok", tmp_path / "model", tmp_path / "log.jsonl")
    lines = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    stage_eval(cfg, tmp_path / "model", tmp_path / "tok", tmp_path / "eval.json")
    evaluated = json.loads((tmp_path / "eval.json").read_text())["val"]

    assert evaluated["windows"] == 20  # thinned: the final validation must have used eval's windows too
    assert abs(info["final_val_loss"] - evaluated["loss"]) <= 1e-6
    assert lines[-1]["final_val_loss"] == info["final_val_loss"]  # the logged number is that one
    estimates = [r["val_loss"] for r in lines if "val_loss" in r]
    assert len(estimates) == 3 and estimates[-1] != info["final_val_loss"]  # other windows: an estimate
