"""`tinystack generate` and `tinystack bench`: inference from the command line (wired by tinystack.cli)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer


def generate(model: Annotated[Path, typer.Option(help="Model directory.")],
             prompt: Annotated[str, typer.Option(help="Prompt text.")],
             max_tokens: int = 64, temperature: float = 0.8, top_k: int = 0, top_p: float = 1.0,
             seed: Optional[int] = None, device: str = "cpu") -> None:
    """Generate a continuation, streaming it to the terminal."""
    from tinystack.infer import Engine, SamplingParams

    engine = Engine.from_dir(model, device=device)
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    sys.stdout.write(prompt)
    emitted: list[int] = []
    shown = ""

    def stream(token_id: int) -> None:  # decode the whole tail so multi-byte characters print whole
        nonlocal shown
        emitted.append(token_id)
        text = engine.tokenizer.decode(emitted)
        if not text.endswith("\ufffd"):
            sys.stdout.write(text[len(shown):])
            sys.stdout.flush()
            shown = text

    g = engine.generate(prompt, params, on_token=stream)
    sys.stdout.write(g.text[len(shown):] + "\n")
    typer.echo(f"[{len(g.token_ids)} tokens, finish_reason={g.finish_reason}, prefill {g.prefill_s * 1e3:.1f} ms, "
               f"decode {g.decode_s * 1e3:.1f} ms]", err=True)


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
