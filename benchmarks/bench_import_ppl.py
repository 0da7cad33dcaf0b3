"""What the import preserves: SmolLM2-135M-Instruct's perplexity on the built-in corpus's test split,
our imported float32 model vs `transformers` loading the same GGUF (its own dequantisation, gguf.quants).

The test split is the repo's own: `tinystack data corpus` (Python standard-library docstrings) then
`tinystack data prepare` with the default config (split by source module), the split every
`tinystack run` evaluates on. Test documents are tokenised with the imported tokenizer.json,
joined with <|endoftext|>, and cut into non-overlapping windows of --window + 1 tokens (evenly
spaced --windows of them, eval.scoring.window_starts); both models score the same windows.
Reported per model: loss, perplexity, bits per byte (bytes of the scored tokens' text), seconds,
and the largest |logit difference| between the two over every scored position.
Writes benchmarks/results/import_ppl.json.

    .venv/bin/python benchmarks/bench_import_ppl.py [--windows 256] [--window 128] [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
NAME = "smollm2-135m-instruct"


def cli(*args: str) -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    subprocess.run([sys.executable, "-m", "tinystack", *args], check=True, cwd=ROOT, env=env)


def test_split(work: Path) -> Path:
    """The default pipeline's test split, built once per work directory."""
    data = work / "data"
    if not (data / "test.jsonl").is_file():
        cli("data", "corpus", "--out", str(work / "corpus.jsonl"))
        cli("data", "prepare", "--input", str(work / "corpus.jsonl"), "--out", str(data), "--no-progress")
    return data / "test.jsonl"


def windows(model_dir: Path, test: Path, window: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(windows [n, window + 1] of token ids, bytes of text per token id)."""
    from tokenizers import Tokenizer

    from tinystack.eval.scoring import window_starts

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    texts = [json.loads(line)["text"] for line in test.read_text(encoding="utf-8").splitlines() if line.strip()]
    ids: list[int] = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids += enc.ids + [eot]
    ids_arr = np.array(ids, dtype=np.int64)
    # byte-level BPE: one vocabulary character per byte of text; added (special) tokens are no text
    nbytes = np.zeros(tok.get_vocab_size(), dtype=np.int64)
    for piece, i in tok.get_vocab(with_added_tokens=False).items():
        nbytes[i] = len(piece)
    for i in tok.get_added_tokens_decoder():
        nbytes[i] = 0
    starts = window_starts(len(ids_arr), window, n)
    return np.stack([ids_arr[s:s + window + 1] for s in starts]), nbytes


@torch.no_grad()
def logits_of(model, x: torch.Tensor) -> torch.Tensor:
    out = model(x)
    return (out[0] if isinstance(out, tuple) else out.logits).float()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=256)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/tinystack-bench-import-ppl"))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/import_ppl.json")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    from bench_common import machine
    from tinystack.atomic import write_json
    from tinystack.model import load_model
    from tinystack.model.importer import import_model, resolve_source

    args.workdir.mkdir(parents=True, exist_ok=True)
    res: dict = {"model": NAME, "machine": {**machine(), "torch_threads": torch.get_num_threads()}}
    test = test_split(args.workdir)
    model_dir = args.workdir / "smollm2"
    import_model(NAME, model_dir)
    wins, nbytes = windows(model_dir, test, args.window, args.windows)
    res["data"] = {"test_split": str(test), "documents": sum(1 for _ in test.open()), "windows": len(wins),
                   "window": args.window, "scored_tokens": int(wins[:, 1:].size),
                   "scored_bytes": int(nbytes[wins[:, 1:]].sum())}
    print(json.dumps(res["data"]), flush=True)
    gguf = resolve_source(NAME)[0]
    models = {"tinystack_import": load_model(model_dir),
              "transformers_gguf": AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                                        dtype=torch.float32).eval()}
    nats: dict[str, list[torch.Tensor]] = {name: [] for name in models}
    seconds = dict.fromkeys(models, 0.0)
    max_diff = 0.0
    for b in range(0, len(wins), args.batch):  # both models on each batch: the logits compare without storing them
        w = torch.from_numpy(wins[b:b + args.batch])
        logits = {}
        for name, model in models.items():
            t = time.perf_counter()
            logits[name] = logits_of(model, w[:, :-1])
            nll = F.cross_entropy(logits[name].transpose(1, 2), w[:, 1:], reduction="none").sum(1).double()
            seconds[name] += time.perf_counter() - t
            nats[name].append(nll)
        a, b_ = logits.values()
        max_diff = max(max_diff, (a - b_).abs().max().item())
    n_tok, n_bytes = res["data"]["scored_tokens"], res["data"]["scored_bytes"]
    for name in models:
        total = float(torch.cat(nats[name]).sum())
        res[name] = {"loss": total / n_tok, "perplexity": math.exp(total / n_tok),
                     "bits_per_byte": total / math.log(2) / n_bytes, "seconds": seconds[name]}
        print(name, json.dumps(res[name]), flush=True)
    a, b_ = (torch.cat(v) for v in nats.values())
    res["max_abs_logit_diff"] = max_diff
    res["windows_with_equal_nll"] = int((a == b_).sum())
    res["max_abs_window_nll_diff"] = float((a - b_).abs().max())
    res["machine"]["loadavg_at_end"] = os.getloadavg()
    print(f"max |logit diff| {max_diff:.3g}; {res['windows_with_equal_nll']}/{len(a)} windows with equal NLL")
    write_json(args.out, res)
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
