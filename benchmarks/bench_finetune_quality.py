"""Fine-tuning quality at the defaults: does `tinystack finetune` learn planted facts without forgetting?

SmolLM2-135M-Instruct (imported by `tinystack model import smollm2-135m-instruct`, as a user does) is
fine-tuned through `tinystack.train.finetune` at the command's defaults (config.FINETUNE_DEFAULTS: LoRA r=16,
steps from the data size, early stopping, best weights kept, replay of the base's answers to 100 general
prompts, the forgetting guard on its 100 built-in general
prompts) on the planted-knowledge set of tests/train/planted_facts.py WITHOUT its general-facts rows: 36
questions about an invented country (three paraphrases per fact) to train on, the fourth paraphrase of each fact
held out (its own source, so the split by source holds all of them out; data.val_fraction=0.25 sends exactly
it to the held-out split). Methods, each at the defaults but for
what the row names:

    defaults              LoRA r=16 + replay of the base's answers to the 100 built-in replay prompts
    lora, no replay       finetune.replay=0
    full                  finetune.lora=0 (full fine-tuning: all weights, its learning rate 2e-5, replay)
    full@2e-4, no replay  full fine-tuning at the old default learning rate, no replay: the guard must stop it

Per method: held-out paraphrase accuracy (greedy answers in float32 contain the fact's keyword), the guard's two
retention scores (nats/token the base's own answers became less likely; share of the factual prompts the base
answered right that the tuned model still answers right) and its verdict, held-out loss base -> tuned, steps,
wall time and tokens/s. Targets at the defaults: held-out accuracy >= 90 %, fact retention >= 95 %, and the
forgetting full fine-tune stopped by the guard (ForgettingError). Every row runs through the guard; a row the
guard stopped is still scored (the model is written, marked rejected).

    .venv/bin/python benchmarks/bench_finetune_quality.py [--methods "defaults;full"] [--out F]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "train"))
from planted_facts import FACTS, heldout_questions  # noqa: E402

from bench_common import RESULTS, finish, machine  # noqa: E402
from tinystack.atomic import write_json  # noqa: E402
from tinystack.config import FINETUNE_DEFAULTS, load_config  # noqa: E402
from tinystack.infer import LLM, SamplingParams  # noqa: E402
from tinystack.infer.chat import chat_formatter, encode_chat  # noqa: E402
from tinystack.model.importer import import_model  # noqa: E402
from tinystack.train.finetune import finetune  # noqa: E402
from tinystack.train.guard import ForgettingError  # noqa: E402

WORK = Path(__file__).resolve().parent / ".cache" / "finetune_quality"
METHODS = {"defaults": [], "lora, no replay": ["finetune.replay=0"], "full": ["finetune.lora=0"],
           "full@2e-4, no replay": ["finetune.lora=0", "train.learning_rate=2e-4", "finetune.replay=0"]}


def planted_rows() -> list[dict]:
    def chat(q: str, a: str) -> list[dict]:
        return [{"role": "user", "content": q}, {"role": "assistant", "content": a}]

    rows = [{"messages": chat(q, a), "source": "veloria-train"} for _, a, *qs in FACTS for q in qs[:-1]]
    return rows + [{"messages": chat(qs[-1], a), "source": "veloria-heldout"} for _, a, *qs in FACTS]


def heldout_accuracy(model_dir: Path) -> tuple[float, list[str]]:
    llm = LLM(model_dir, weight_format="float32", memory_limit_mb=2048)
    fmt = chat_formatter(model_dir, llm.tokenizer)
    qs = heldout_questions()
    prompts = [encode_chat(llm.tokenizer, fmt.render([{"role": "user", "content": q}])) for _, q in qs]
    outs = llm.generate(prompts, SamplingParams(max_tokens=24, temperature=0))
    return sum(k.lower() in o.text.lower() for (k, _), o in zip(qs, outs)) / len(qs), [o.text for o in outs]


def run(method: str, base: Path, data: Path) -> dict:
    # the held-out source is a quarter of the rows: a val share that sends exactly it (the split is by source)
    cfg = load_config(None, ["train.plot=false", "data.val_fraction=0.25", *METHODS[method]],
                      defaults=FINETUNE_DEFAULTS)
    out = WORK / "".join(c if c.isalnum() or c in "-." else "_" for c in method)
    t0 = time.perf_counter()
    stopped = None
    try:
        report = finetune(base, data, out, cfg, progress=False)
    except ForgettingError as e:
        stopped = str(e)
        report = json.loads((out.with_name(out.name + "_finetune") / "report.json").read_text())
    wall = time.perf_counter() - t0
    acc, answers = heldout_accuracy(out)
    r, h = report["retention"], report["heldout"]
    return {"method": method, "overrides": METHODS[method], "heldout_accuracy": acc, "heldout_answers": answers,
            "fact_retention": r["fact_retention"], "facts_kept": r["facts_kept"],
            "facts_base_right": r["facts_base_right"], "nll_increase": r["nll_increase"], "lost": r["lost"],
            "guard_passed": r["passed"], "stopped_by_guard": stopped, "heldout_loss": [h["base_loss"],
                                                                                        h["finetuned_loss"]],
            "schedule": report["schedule"], "steps": report["result"]["steps"],
            "stopped_early": report["result"]["stopped_early"], "best_step": report["result"]["best_step"],
            "train_wall_s": report["result"]["wall_s"], "tokens_per_s": report["result"]["tokens_per_s"],
            "command_wall_s": wall, "replayed": report["data"]["replayed"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default=";".join(METHODS),
                    help='";"-separated: names above, or "label:section.key=value,section.key=value"')
    ap.add_argument("--out", type=Path, default=RESULTS / "finetune_quality.json")
    args = ap.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    base = WORK / "smollm2"
    if not (base / "config.json").is_file():
        import_model("smollm2-135m-instruct", base)
    data = WORK / "planted.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in planted_rows()))
    res = {"machine": machine(), "data": {"train_rows": 36, "heldout_rows": 12}, "runs": []}
    for method in args.methods.split(";"):
        if ":" in method:  # an ad-hoc method: "label:section.key=value,section.key=value"
            label, overrides = method.split(":", 1)
            METHODS[label] = overrides.split(",")
            method = label
        row = run(method, base, data)
        print({k: v for k, v in row.items() if k not in ("heldout_answers", "lost")}, flush=True)
        res["runs"].append(row)
        write_json(args.out, finish(res))
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
