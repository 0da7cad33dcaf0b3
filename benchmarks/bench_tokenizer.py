"""Benchmark the byte-level BPE tokenizer: training time and encode throughput.

Trains a 4,096-id vocabulary on the first 1 MB of tinyshakespeare, then encodes
that same text with ours (cold cache, then warm) and, side by side, with tiktoken
and HF `tokenizers` built from *our* merges (reference speed, same ids).
Writes benchmarks/results/tokenizer.json.

    .venv/bin/python benchmarks/bench_tokenizer.py [--data PATH] [--bytes N] [--vocab-size V]
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from tinystack.atomic import write_json
from tinystack.tokenizer import BPETokenizer

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared/data/tinyshakespeare.txt"


def best_of(fn, repeat: int) -> tuple[float, object]:
    """Min wall time over `repeat` runs (the least noisy estimate) and the last result."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--bytes", type=int, default=1_000_000)
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/tokenizer.json")
    args = ap.parse_args()

    text = args.data.read_bytes()[: args.bytes].decode("utf-8", errors="ignore")
    mb = len(text.encode("utf-8")) / 1e6

    t0 = time.perf_counter()
    tok = BPETokenizer.train([text], args.vocab_size)
    train_s = time.perf_counter() - t0

    with tempfile.TemporaryDirectory() as d:
        path = tok.save(d)
        t0 = time.perf_counter()
        fresh = BPETokenizer.load(d)  # empty piece cache: the first encode is "cold"
        load_s = time.perf_counter() - t0
        cold_s, _ = best_of(lambda: fresh.encode(text), 1)
        warm_s, ids = best_of(lambda: tok.encode(text), args.repeat)
        dec_s, _ = best_of(lambda: tok.decode(ids), args.repeat)
        res: dict[str, object] = {
            "data": os.path.relpath(args.data.resolve(), ROOT), "megabytes": round(mb, 3), "vocab_size": tok.vocab_size,
            "train_seconds": round(train_s, 3), "load_seconds": round(load_s, 3),
            "encode_mb_per_s_cold": round(mb / cold_s, 2), "encode_mb_per_s_warm": round(mb / warm_s, 2),
            "decode_mb_per_s": round(mb / dec_s, 2), "tokens": len(ids),
            "bytes_per_token": round(len(text.encode()) / len(ids), 3), "fingerprint": tok.fingerprint(),
            "roundtrip_ok": tok.decode(ids) == text,
        }
        try:  # references built from our merges, for speed comparison and an id check
            import tiktoken

            enc = tiktoken.Encoding(name="tinystack", pat_str=tok.pattern,
                                    mergeable_ranks=tok.mergeable_ranks(), special_tokens=tok.special_tokens)
            s, tt_ids = best_of(lambda: enc.encode(text, allowed_special="all"), args.repeat)
            res.update(tiktoken_encode_mb_per_s=round(mb / s, 2), tiktoken_same_ids=tt_ids == ids)
        except ImportError:
            pass
        try:
            from tokenizers import Tokenizer

            hf = Tokenizer.from_file(str(path))
            s, hf_enc = best_of(lambda: hf.encode(text), args.repeat)
            res.update(hf_tokenizers_encode_mb_per_s=round(mb / s, 2), hf_tokenizers_same_ids=hf_enc.ids == ids)
        except ImportError:
            pass

    res["machine"] = {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()}
    write_json(args.out, res)
    for k, v in res.items():
        print(f"{k:32s} {v}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
