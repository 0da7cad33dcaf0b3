"""Planted knowledge: LoRA-fine-tune the real SmolLM2-135M-Instruct on facts about an invented country, then ask
it through the inference engine and the served OpenAI API. It must answer the facts (also paraphrases it
never saw), and what it knew before (untrained capitals) must survive."""
import json

import httpx
import pytest
from finetune_helpers import write_jsonl
from planted_facts import FACTS, GENERAL_TEST, OPEN_PROMPTS, conversations, heldout_questions

from tinystack.config import FINETUNE_DEFAULTS, InferConfig, ServeConfig, load_config
from tinystack.eval.scoring import score_batches
from tinystack.infer import LLM, AsyncEngine, SamplingParams
from tinystack.infer.chat import chat_formatter, encode_chat
from tinystack.model import load_model
from tinystack.serve import create_app, run_in_background
from tinystack.tokenizer import load_tokenizer
from tinystack.train.finetune import finetune
from tinystack.train.finetune_batches import encode_conversation, fixed_batches

transformers = pytest.importorskip("transformers")
# nats per token the base model's own answers to general prompts may become less likely after fine-tuning
# (measured +0.65: 0.98 -> 1.63; a model that forgot how to chat scores several nats worse)
MAX_DRIFT = 1.0


def _ask(llm, model_dir, questions, max_tokens=24):
    fmt = chat_formatter(model_dir, llm.tokenizer)
    prompts = [encode_chat(llm.tokenizer, fmt.render([{"role": "user", "content": q}])) for q in questions]
    return [o.text for o in llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0))]


def _answers_loss(model_dir, questions, answers):
    """Mean loss per assistant token of `model_dir` on these (question, answer) conversations."""
    tok = load_tokenizer(model_dir)
    fmt = chat_formatter(model_dir, tok)
    examples = [encode_conversation([{"role": "user", "content": q}, {"role": "assistant", "content": a}],
                                    fmt, tok, 256) for q, a in zip(questions, answers)]
    return score_batches(load_model(model_dir), fixed_batches(examples, 8, tok.eos_token_id)).loss


@pytest.mark.slow  # 16 LoRA steps and generation on a 135M model: ~60 s on an idle 2-core machine
def test_lora_learns_planted_facts_and_keeps_general_knowledge(smollm2_dir, tmp_path, monkeypatch):
    data = write_jsonl(tmp_path / "veloria.jsonl", conversations())
    cfg = load_config(None, ["finetune.lora=16", "finetune.lora_alpha=32", "train.max_iters=16",
                             "train.batch_size=8", "train.learning_rate=3e-3", "train.min_lr=3e-4",
                             "train.warmup_iters=3", "train.eval_interval=100", "data.val_fraction=0.2",
                             # float32 as asked below (no precision probe); torch's default threads
                             "train.dtype=float32", "train.plot=false"], defaults=FINETUNE_DEFAULTS)
    out = tmp_path / "tuned"
    report = finetune(smollm2_dir, data, out, cfg, progress=False)
    held = report["heldout"]  # the val split is the "veloria-heldout" source: paraphrases never trained on
    assert held["conversations"] >= 10 and held["finetuned_loss"] < 0.25 * held["base_loss"], held

    general_q = [q for _, q in GENERAL_TEST] + OPEN_PROMPTS
    # Asked in float32, the precision it was trained in; the served model below loads as a user's serve does
    base_llm = LLM(smollm2_dir, weight_format="float32", memory_limit_mb=1024)
    base_general = _ask(base_llm, smollm2_dir, general_q, max_tokens=48)
    del base_llm
    llm = LLM(out, weight_format="float32", memory_limit_mb=1024)
    trained_q = [qs[0] for _, _, *qs in FACTS]
    answers = _ask(llm, out, trained_q + [q for _, q in heldout_questions()] + general_q)
    del llm
    trained, heldout, general = answers[:len(FACTS)], answers[len(FACTS):2 * len(FACTS)], answers[2 * len(FACTS):]
    keywords = [k for k, *_ in FACTS]
    assert all(k in a for k, a in zip(keywords, trained)), list(zip(keywords, trained))
    assert sum(k in a for k, a in zip(keywords, heldout)) >= len(FACTS) - 2, list(zip(keywords, heldout))
    for (k, q), before, after in zip(GENERAL_TEST, base_general, general):
        assert k.lower() in before.lower(), f"the base model should know {q!r}: {before!r}"
        assert k.lower() in after.lower(), f"fine-tuning broke {q!r}: {before!r} -> {after!r}"
    drift = _answers_loss(out, general_q, base_general) - _answers_loss(smollm2_dir, general_q, base_general)
    assert drift < MAX_DRIFT, drift

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
