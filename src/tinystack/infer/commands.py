"""`tinystack generate` and `tinystack bench`: inference from the command line (wired by tinystack.cli)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer


def generate(model: Annotated[Path, typer.Option(help="Model directory.")],
             prompt: Annotated[str, typer.Option(help="Prompt text.")],
             max_tokens: int = 64, temperature: float = 0.8, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
             seed: Optional[int] = None, device: str = "cpu",
             stop: Annotated[Optional[list[str]], typer.Option(help="Stop string (repeatable).")] = None,
             repetition_penalty: float = 1.0, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
             ignore_eos: bool = False,
             backend: Annotated[str, typer.Option(help="torch | numpy")] = "torch",
             dtype: Annotated[str, typer.Option(help="auto | float32 | bfloat16")] = "auto",
             kv_cache: Annotated[str, typer.Option(help="paged | contiguous")] = "paged",
             quantize: Annotated[Optional[str],
                                 typer.Option(help="bf16 | q8_0 (int8) | q4_0 | q4_1 weights")] = None) -> None:
    """Generate a continuation, streaming it to the terminal."""
    from tinystack.infer import LLMEngine, SamplingParams, load_for_inference

    m, tok = load_for_inference(model, backend, device, dtype, quantize)
    engine = LLMEngine(m, tok, kv_cache=kv_cache, max_num_seqs=1, stream_text=True)  # budget -> stderr
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            seed=seed, stop=tuple(stop or ()), repetition_penalty=repetition_penalty,
                            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                            ignore_eos=ignore_eos)
    engine.add_request("cli", prompt, params)
    sys.stdout.write(prompt)
    sys.stdout.flush()
    out = None
    while engine.has_unfinished():
        for d in engine.step():
            sys.stdout.write(d.text)  # whole characters only: the engine holds back partial UTF-8
            sys.stdout.flush()
            out = d.output or out
    sys.stdout.write("\n")
    m_ = out.metrics
    typer.echo(f"[{len(out.token_ids)} tokens, finish_reason={out.finish_reason}, "
               f"time to first token {m_.ttft_s * 1e3:.1f} ms, decode {(m_.decode_s or 0) * 1e3:.1f} ms]", err=True)


def bench(model: Annotated[Path, typer.Option(help="Model directory.")],
          prompt_tokens: int = 64, new_tokens: int = 64, device: str = "cpu",
          out: Annotated[Optional[Path], typer.Option(help="Write the figures as JSON here.")] = None) -> None:
    """Decode speed with the KV cache vs recomputing the whole sequence every token."""
    from tinystack.atomic import write_json
    from tinystack.infer.bench import kv_cache_speedup

    result = kv_cache_speedup(model, prompt_tokens=prompt_tokens, new_tokens=new_tokens, device=device)
    typer.echo(json.dumps(result, indent=2))
    if out:
        write_json(out, result)
