"""INT8 weight-only quantisation: memory saved, speed, and what it changes (GPT-2-124M shape, random weights).

- memory: bytes of the linear layers' weights, float32 vs int8 + per-row scales (the tied
  output head / embedding stays float32, see infer/quant.py), and of the whole model
- speed: batch-1 decode, 64 new tokens after a 128-token prompt (trials interleaved, median)
- perplexity: on "validation" text sampled from the float32 model itself (temperature 1),
  so the float model's perplexity is a meaningful baseline even with random weights;
  or on --val-text tokenised with --model's tokenizer when a trained model is given
- greedy outputs: share of identical tokens and first divergence over 8 prompts x 32 tokens
Writes benchmarks/results/quant.json.

    .venv/bin/python benchmarks/bench_quant.py [--threads 1] [--model DIR --val-text FILE]
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import RESULTS, finish, machine, timed  # noqa: E402
from bench_infer_common import IdTokenizer, gpt2_124m, random_prompt  # noqa: E402
from tinystack.atomic import write_json  # noqa: E402
from tinystack.infer import LLM, SamplingParams  # noqa: E402
from tinystack.infer.quant import quantize_int8  # noqa: E402


def model_bytes(model) -> int:
    ps = {id(p): p for p in model.parameters()}.values()
    return sum(p.numel() * p.element_size() for p in ps) + sum(b.numel() * b.element_size() for b in model.buffers())


@torch.inference_mode()
def perplexity(model, seqs: list[list[int]]) -> float:
    nll, n = 0.0, 0
    for s in seqs:
        ids = torch.tensor([s])
        logits, _ = model(ids)
        nll += F.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="sum").item()
        n += len(s) - 1
    return math.exp(nll / n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--val-text", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=RESULTS / "quant.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.model:
        from tinystack.tokenizer import load_tokenizer
        from tinystack.model import load_model

        fp, q, tok = load_model(args.model), load_model(args.model), load_tokenizer(args.model)
    else:
        fp, _ = gpt2_124m()
        q, _ = gpt2_124m()  # same seed: the same weights
        tok = IdTokenizer()
    report = quantize_int8(q)
    res = {"model": str(args.model or "GPT-2-124M shape, random weights"), "machine": machine(),
           "linear_weights": report, "model_bytes_fp32": model_bytes(fp), "model_bytes_int8": model_bytes(q)}
    print(f"linear weights {report['bytes_before'] / 2**20:.1f} MiB -> {report['bytes_after'] / 2**20:.1f} MiB; "
          f"model {res['model_bytes_fp32'] / 2**20:.1f} -> {res['model_bytes_int8'] / 2**20:.1f} MiB", flush=True)

    llms = {name: LLM(m, tok, kv_cache="contiguous", max_num_seqs=8, max_num_batched_tokens=1024)
            for name, m in (("fp32", fp), ("int8", q))}
    prompt = random_prompt(128, seed=1, vocab=fp.config.vocab_size)
    greedy = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    times = {"fp32": [], "int8": []}
    for name in llms:
        llms[name].generate([prompt[:8]], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    for _ in range(args.trials):
        for name, llm in llms.items():
            times[name].append(timed(lambda: llm.generate([prompt], greedy)).cpu_s)
    res["decode_tokens_per_s"] = {k: 64 / statistics.median(v) for k, v in times.items()}
    res["speedup"] = res["decode_tokens_per_s"]["int8"] / res["decode_tokens_per_s"]["fp32"]
    print(f"batch-1 decode: fp32 {res['decode_tokens_per_s']['fp32']:.2f} tok/s, int8 "
          f"{res['decode_tokens_per_s']['int8']:.2f} tok/s ({res['speedup']:.2f}x)", flush=True)

    if args.val_text:
        ids = tok.encode_ordinary(args.val_text.read_text(encoding="utf-8"))
        val = [ids[i:i + 256] for i in range(0, min(len(ids), 256 * 8) - 1, 256)]
    else:
        outs = llms["fp32"].generate([random_prompt(8, seed=50 + i) for i in range(4)],
                                     SamplingParams(temperature=1.0, seed=0, max_tokens=248, ignore_eos=True))
        val = [o.prompt_token_ids + o.token_ids for o in outs]
    res["perplexity"] = {"fp32": perplexity(fp, val), "int8": perplexity(q, val), "tokens": sum(map(len, val))}
    res["perplexity"]["relative_change"] = res["perplexity"]["int8"] / res["perplexity"]["fp32"] - 1
    print(f"perplexity fp32 {res['perplexity']['fp32']:.3f} -> int8 {res['perplexity']['int8']:.3f} "
          f"({res['perplexity']['relative_change']:+.2%})", flush=True)

    prompts = [random_prompt(32, seed=100 + i, vocab=fp.config.vocab_size) for i in range(8)]
    p32 = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    a, b = llms["fp32"].generate(prompts, p32), llms["int8"].generate(prompts, p32)
    same = [sum(x == y for x, y in zip(o.token_ids, r.token_ids)) / 32 for o, r in zip(a, b)]
    first = [next((i for i, (x, y) in enumerate(zip(o.token_ids, r.token_ids)) if x != y), 32) for o, r in zip(a, b)]
    res["greedy"] = {"identical_token_share": statistics.mean(same), "first_divergence": first,
                     "identical_sequences": sum(f == 32 for f in first), "sequences": len(first)}
    print(f"greedy: {res['greedy']['identical_sequences']}/8 sequences identical over 32 tokens, "
          f"{res['greedy']['identical_token_share']:.0%} of tokens; first divergence at {first}")
    write_json(args.out, finish(res))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
