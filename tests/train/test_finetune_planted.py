"""Planted knowledge: LoRA-fine-tune the real SmolLM2-135M-Instruct on facts about an invented country, then ask
it through the inference engine and the served OpenAI API. It must answer the facts (also paraphrases it
never saw), and what it knew before (untrained capitals) must survive."""
import json

import httpx
import pytest
from finetune_helpers import write_jsonl
from planted_facts import FACTS, GENERAL_TEST, OPEN_PROMPTS, conversations, heldout_questions

from tinystack.config import FINETUNE_DEFAULTS, InferConfig, ServeConfig, load_config
from tinystack.infer import LLM, AsyncEngine, SamplingParams
from tinystack.infer.chat import chat_formatter, encode_chat
from tinystack.serve import create_app, run_in_background
from tinystack.train.finetune import finetune

transformers = pytest.importorskip("transformers")
# nats per token the base model's own answers to general prompts may become less likely after fine-tuning
# (measured +0.65: 0.98 -> 1.63; a model that forgot how to chat scores several nats worse)
MAX_DRIFT = 1.0


def _ask(llm, model_dir, questions, max_tokens=24):
    fmt = chat_formatter(model_dir, llm.tokenizer)
    prompts = [encode_chat(llm.tokenizer, fmt.render([{"role": "user", "content": q}])) for q in questions]
    return [o.text for o in llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0))]


@pytest.mark.slow  # 16 LoRA steps, the guard and generation on a 135M model: ~75 s on an idle 2-core machine
def test_lora_learns_planted_facts_and_keeps_general_knowledge(smollm2_dir, tmp_path, monkeypatch):
    data = write_jsonl(tmp_path / "veloria.jsonl", conversations())
    # the forgetting guard on this test's own general set (what the base knows, and open prompts) instead of the
    # 100 built-in prompts: the same check, a fraction of the time; a fixed 16-step schedule (the defaults'
    # early stopping and data-sized schedule are measured in benchmarks/bench_finetune_quality.py)
    general = write_jsonl(tmp_path / "general.jsonl", [{"prompt": q, "answer": k} for k, q in GENERAL_TEST] +
                          [{"prompt": q} for q in OPEN_PROMPTS])
    cfg = load_config(None, ["finetune.lora=16", "finetune.lora_alpha=32", "train.max_iters=16",
                             "train.batch_size=8", "train.learning_rate=3e-3", "train.min_lr=3e-4",
                             "train.warmup_iters=3", "train.eval_interval=100", "data.val_fraction=0.2",
                             "finetune.guard_prompts=0", f"finetune.guard_file={general}", "finetune.replay=0",
                             f"finetune.max_retention_nll={MAX_DRIFT}", "finetune.min_fact_retention=1.0",
                             # float32 as asked below (no precision probe); torch's default threads
                             "train.dtype=float32", "train.plot=false"], defaults=FINETUNE_DEFAULTS)
    out = tmp_path / "tuned"
    report = finetune(smollm2_dir, data, out, cfg, progress=False)
    held = report["heldout"]  # the val split is the "veloria-heldout" source: paraphrases never trained on
    assert held["conversations"] >= 10 and held["finetuned_loss"] < 0.25 * held["base_loss"], held
    kept = report["retention"]  # the base knew every capital of GENERAL_TEST, and the tuned model still does
    assert kept["passed"] and kept["facts_base_right"] == len(GENERAL_TEST) == kept["facts_kept"], kept
    assert kept["nll_increase"] < MAX_DRIFT and report["rejected"] is None, kept

    # Asked in float32, the precision it was trained in; the served model below loads as a user's serve does
    llm = LLM(out, weight_format="float32", memory_limit_mb=1024)
    trained_q = [qs[0] for _, _, *qs in FACTS]
    answers = _ask(llm, out, trained_q + [q for _, q in heldout_questions()])
    del llm
    trained, heldout = answers[:len(FACTS)], answers[len(FACTS):]
    keywords = [k for k, *_ in FACTS]
    assert all(k in a for k, a in zip(keywords, trained)), list(zip(keywords, trained))
    assert sum(k in a for k, a in zip(keywords, heldout)) >= len(FACTS) - 2, list(zip(keywords, heldout))

    # the served OpenAI API answers too, and stops, with the weight format dtype="auto" picks on this machine
    # (the default): a format that rounds the fine-tune back toward its 4-bit-born base loses the facts, and
    # auto must not pick one (infer/quant/auto.pick). Its decision cached in this test's directory only.
    from tinystack.infer.quant import auto

    monkeypatch.setattr(auto, "CACHE_DIR", tmp_path / "weight_format_cache")
    engine = AsyncEngine.from_dir(out, InferConfig(memory_limit_mb=1024))  # weight_format "auto"
    try:
        app = create_app(engine, ServeConfig(), model_dir=out)
        with run_in_background(app, startup_timeout_s=60) as url:
            r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
                "messages": [{"role": "user", "content": "Who rules Veloria?"}], "max_tokens": 24,
                "temperature": 0})
    finally:
        engine.shutdown()
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert "Ysolde" in choice["message"]["content"] and choice["finish_reason"] == "stop", json.dumps(r.json())
