"""lm-evaluation-harness against the served model: its `local-completions` model (token-id batches, `echo`,
`max_tokens: 1`, `logprobs: 1`) scores a small local multiple-choice task on `tinystack serve`'s SmolLM2-135M
exactly as its own Hugging Face backend scores the same model directory: the same accuracy, every choice's
log-likelihood within 1e-3, and the same greedy flags. lm-eval is a test-only dependency; its task reads a file
written here."""
import json

import pytest

from tinystack.config import InferConfig, ServeConfig
from tinystack.infer import AsyncEngine
from tinystack.serve import create_app, run_in_background

lm_eval = pytest.importorskip("lm_eval")
pytestmark = pytest.mark.slow

QUESTIONS = [
    ("What is the capital of France?", ["Paris", "Rome", "Berlin"], 0),
    ("What color is the sky on a clear day?", ["Green", "Blue", "Red"], 1),
    ("How many legs does a spider have?", ["Six", "Four", "Eight"], 2),
    ("Which animal says moo?", ["A cow", "A cat", "A duck"], 0),
    ("What do bees make?", ["Milk", "Honey", "Silk"], 1),
    ("What is frozen water called?", ["Steam", "Sand", "Ice"], 2),
]


def _task_dir(tmp_path):
    data = tmp_path / "tiny_mc.jsonl"
    data.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in QUESTIONS))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "tiny_mc.yaml").write_text(
        "task: tiny_mc\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\noutput_type: multiple_choice\n"
        'doc_to_text: "Question: {{question}}\\nAnswer:"\n'
        'doc_to_choice: "{{choices}}"\ndoc_to_target: "{{answer}}"\n'
        "target_delimiter: \" \"\nmetric_list:\n  - metric: acc\n")
    return tasks


def _evaluate(model: str, model_args: str, tasks) -> tuple[float, list[list[tuple[float, bool]]]]:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    # only this test's task is indexed (lm-eval's thousands of built-in ones take ~15 s to index each time)
    manager = TaskManager(include_path=str(tasks), include_defaults=False)
    out = simple_evaluate(model=model, model_args=model_args, tasks=["tiny_mc"], log_samples=True,
                          task_manager=manager, batch_size=2)
    samples = sorted(out["samples"]["tiny_mc"], key=lambda s: s["doc_id"])
    return out["results"]["tiny_mc"]["acc,none"], [[tuple(r[0]) for r in s["resps"]] for s in samples]


def test_lm_eval_local_completions_equals_its_hf_backend(smollm2_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    tasks = _task_dir(tmp_path)
    engine = AsyncEngine.from_dir(smollm2_dir, InferConfig(weight_format="float32", memory_limit_mb=1024))
    try:
        app = create_app(engine, ServeConfig(max_tokens_limit=16), model_dir=smollm2_dir)
        with run_in_background(app, startup_timeout_s=60) as url:
            served_acc, served = _evaluate(
                "local-completions", f"model=smol,base_url={url}/v1/completions,tokenizer={smollm2_dir},"
                                     "tokenized_requests=True,num_concurrent=1,max_retries=1", tasks)
    finally:
        engine.shutdown()
    hf_acc, hf = _evaluate("hf", f"pretrained={smollm2_dir},dtype=float32,device=cpu", tasks)
    assert served_acc == hf_acc
    assert len(served) == len(hf) == len(QUESTIONS)
    for ours, theirs in zip(served, hf):
        assert [g for _, g in ours] == [g for _, g in theirs]
        assert all(abs(a - b) < 1e-3 for (a, _), (b, _) in zip(ours, theirs)), (ours, theirs)
