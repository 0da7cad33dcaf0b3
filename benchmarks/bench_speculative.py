"""Speculative decoding on SmolLM2-135M-Instruct: tokens/s and acceptance, speculative vs plain, in one run.

Workloads (chat-templated, greedy, ignore EOS so every run makes the same number of tokens):
  edit   code editing: the prompt holds a function and asks for it back with one small change, so most of
         the answer is in the prompt (where prompt lookup should pay)
  chat   open-ended chat (a story, an explanation): little of the answer is in the prompt (where it should lose)
Modes on the SAME engine (same weights, same cache; only its speculator is swapped between runs):
  plain          no speculation
  prompt_lookup  n-gram drafts from prompt + output (k = --k)
  draft models   no smaller model with SmolLM2's tokenizer is available offline, so two honest stand-ins:
    draft_cut    SmolLM2 cut to its first --draft-layers of 30 layers (embeddings, final norm, head kept), not
                 trained as a draft: it agrees with the full model on ~1-3 % of next tokens (measured when this
                 was written), so it shows what a poor draft costs
    draft_q4     SmolLM2 itself with Q4_0 weights (a cheaper copy of the target, "self-speculation"): it agrees
                 often; it pays only where the target's own format costs well above Q4_0 per pass
Each case runs at --concurrency 1 (batch 1) and with several requests at once (continuous batching; every
sequence its own drafts). Trials interleave the modes in a shuffled order; medians. Reported per case:
output tok/s (wall), the acceptance rate (accepted / proposed drafts), tokens per target forward, and whether
the speculative output is token-for-token the plain greedy output.

    .venv/bin/python benchmarks/bench_speculative.py [--quick] [--trials 3] [--new-tokens 128] [--k 4]

Writes benchmarks/results/speculative.json and speculative.png (--quick: speculative_quick.*).
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import RESULTS, finish, machine, timed  # noqa: E402
from tinystack.atomic import write_json  # noqa: E402

NAME = "smollm2-135m-instruct"
CODE = [
    '''def mean(values):
    """Return the arithmetic mean of a list of numbers."""
    total = 0
    for value in values:
        total += value
    return total / len(values)
''',
    '''def read_config(path):
    with open(path) as f:
        lines = f.read().splitlines()
    config = {}
    for line in lines:
        if "=" in line:
            key, value = line.split("=", 1)
            config[key.strip()] = value.strip()
    return config
''',
    '''class Counter:
    def __init__(self):
        self.counts = {}

    def add(self, item):
        self.counts[item] = self.counts.get(item, 0) + 1

    def most_common(self):
        return max(self.counts, key=self.counts.get)
''',
]
EDITS = ["Rename the function to `{new}` and return the full code.", "Add type hints and return the full code.",
         "Rename the variable `config` to `settings` and return the full code."]
CHAT = ["Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "Explain why the sky is blue to a ten-year-old.",
        "What are three good habits for staying healthy? Explain each.",
        "Describe a day in the life of a medieval blacksmith."]


def prompts(model_dir: Path, tok, kind: str, n: int) -> list[list[int]]:
    from tinystack.infer.chat import chat_formatter, encode_chat

    fmt = chat_formatter(model_dir, tok)
    out = []
    for i in range(n):
        if kind == "edit":
            ask = EDITS[i % len(EDITS)].format(new=f"compute_{i}")
            text = f"{ask}\n\n```python\n{CODE[i % len(CODE)]}```"
        else:
            text = CHAT[i % len(CHAT)]
        out.append(encode_chat(tok, fmt.render([{"role": "user", "content": text}])))
    return out


def truncated_copy(model_dir: Path, out: Path, layers: int) -> Path:
    """SmolLM2 with only its first `layers` blocks: the stand-in draft model (same tokenizer files)."""
    from tinystack.model.io import load_model, save_model
    from tinystack.tokenizer import load_tokenizer

    if (out / "config.json").is_file():
        return out
    model = load_model(model_dir)
    model.model.layers = model.model.layers[:layers]
    model.config.n_layer = layers
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_model(model, tmp, eos_token_id=load_tokenizer(model_dir).eos_token_id)
    for f in model_dir.iterdir():  # tokenizer, its config and chat template
        if f.is_file() and not (tmp / f.name).exists() and f.suffix != ".safetensors":
            shutil.copy(f, tmp / f.name)
    tmp.rename(out)
    return out


def run_case(llm, speculators: dict, batch: list[list[int]], new_tokens: int, trials: int) -> dict:
    from tinystack.infer import SamplingParams

    greedy = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    engine = llm.engine
    times: dict[str, list[float]] = {m: [] for m in speculators}
    outputs, accept = {}, {}
    for _ in range(trials):
        order = list(speculators)
        random.shuffle(order)
        for mode in order:
            engine.speculator = speculators[mode]
            p0, a0 = engine.spec_proposed_tokens, engine.spec_accepted_tokens
            steps0 = engine.counters.steps
            t = timed(lambda: llm.generate(batch, greedy))
            times[mode].append(t.wall_s)
            outputs[mode] = [o.token_ids for o in t.value]
            accept[mode] = (engine.spec_proposed_tokens - p0, engine.spec_accepted_tokens - a0,
                            engine.counters.steps - steps0)
    n_out = sum(map(len, outputs["plain"]))
    res = {}
    for mode in speculators:
        proposed, accepted, steps = accept[mode]
        wall = statistics.median(times[mode])
        res[mode] = {"wall_s": wall, "tok_per_s": n_out / wall, "trials_wall_s": times[mode],
                     "proposed": proposed, "accepted": accepted,
                     "acceptance": accepted / proposed if proposed else None,
                     "tokens_per_step": n_out / max(1, steps),
                     "identical_to_plain": outputs[mode] == outputs["plain"]}
        res[mode]["speedup"] = res["plain"]["wall_s"] / wall if "plain" in res else 1.0
    return res


def plot(results: dict, path: Path) -> None:
    from tinystack.plotting import pyplot

    plt = pyplot()
    cases = list(results)
    modes = list(results[cases[0]])
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(modes)
    for j, mode in enumerate(modes):
        xs = [i + (j - (len(modes) - 1) / 2) * width for i in range(len(cases))]
        ys = [results[c][mode]["tok_per_s"] for c in cases]
        bars = ax.bar(xs, ys, width, label=mode)
        for b, c in zip(bars, cases):
            acc = results[c][mode]["acceptance"]
            if acc is not None:
                ax.annotate(f"{acc:.0%}", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom",
                            fontsize=7)
    ax.set_xticks(range(len(cases)), cases, fontsize=8)
    ax.set_ylabel("output tokens / s (wall)")
    ax.set_title("SmolLM2-135M speculative decoding (label: draft acceptance)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 8 tokens, 1 trial, batch 1 and 2")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--draft-layers", type=int, default=6, help="layers of SmolLM2 kept in the draft model")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--weight-format", dest="dtype", default="auto")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/tinystack-bench-speculative"))
    args = ap.parse_args()
    if args.quick:
        args.trials, args.new_tokens, args.concurrency = 1, 8, [1, 2]
    from tinystack.config import InferConfig
    from tinystack.infer import LLM, load_for_inference
    from tinystack.infer.speculative import build_speculator
    from tinystack.model.importer import import_model

    random.seed(0)
    info = machine()  # the load average at the start
    target_dir = args.workdir / "smollm2"
    if not (target_dir / "config.json").is_file():
        import_model(NAME, target_dir)
    draft_dir = truncated_copy(target_dir, args.workdir / f"smollm2-first{args.draft_layers}", args.draft_layers)
    llm = LLM(target_dir, weight_format=args.dtype, max_num_seqs=max(args.concurrency))
    engine = llm.engine
    slots = engine.budget.num_blocks * engine.block_manager.block_size
    spec = dataclasses.replace(engine.config, num_speculative_tokens=args.k)

    def draft(model):  # the engine's own construction for speculative="draft", with this model as the draft
        return build_speculator(dataclasses.replace(spec, speculative="draft"), block_manager=engine.block_manager,
                                draft=model, target=engine.model, tokenizer=llm.tokenizer, token_slots=slots)

    speculators = {"plain": None,
                   "prompt_lookup": build_speculator(dataclasses.replace(spec, speculative="prompt_lookup"),
                                                     block_manager=engine.block_manager),
                   "draft_cut": draft(load_for_inference(draft_dir, tokenizer=False)[0]),
                   "draft_q4": draft(load_for_inference(target_dir, InferConfig(weight_format="q4_0"),
                                                        tokenizer=False)[0])}
    results = {}
    for kind in ("edit", "chat"):
        for n in args.concurrency:
            case = f"{kind} x{n}"
            results[case] = run_case(llm, speculators, prompts(target_dir, llm.tokenizer, kind, n), args.new_tokens,
                                     args.trials)
            row = results[case]
            print(case, "  ".join(f"{m}: {r['tok_per_s']:.1f} tok/s x{r['speedup']:.2f}"
                                  + (f" acc {r['acceptance']:.0%}" if r["acceptance"] is not None else "")
                                  + ("" if r["identical_to_plain"] else " (differs)") for m, r in row.items()),
                  flush=True)
    loses = [f"{c} {m}" for c, row in results.items() for m, r in row.items() if m != "plain" and r["speedup"] < 1]
    suffix = "_quick" if args.quick else ""
    res = finish({"benchmark": "speculative", "model": NAME, "dtype": args.dtype, "k": args.k,
                  "drafts": {"draft_cut": f"SmolLM2 cut to its first {args.draft_layers} of 30 layers (not trained)",
                             "draft_q4": "SmolLM2 with Q4_0 weights"},
                  "new_tokens": args.new_tokens, "trials": args.trials, "quick": args.quick,
                  "results": results, "speculation_loses": loses, "machine": info})
    write_json(RESULTS / f"speculative{suffix}.json", res)
    plot(results, RESULTS / f"speculative{suffix}.png")
    print("speculation loses on:", ", ".join(loses) or "nothing")


if __name__ == "__main__":
    main()
