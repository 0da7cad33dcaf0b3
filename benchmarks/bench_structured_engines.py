"""bench_structured's matcher side: test cases from a directory, three grammar engines behind one interface,
and one walk of an instance's tokens through a matcher.

    load_cases(dir)   MaskBench files ({"schema", "tests": [{"data", "valid"}]}, one schema each) and
                      JSON-Schema-Test-Suite files (a list of {"description", "schema", "tests"}), any depth
    Ours              tinystack.infer.structured: compile_grammar (its cache cleared before every timed compile,
                      so no schema is served from an earlier one), Matcher over our tokenizer's bridge
    LlgDirect         llguidance.LLMatcher on llguidance's own tokenizer built from tokenizer.json's text, the same
                      grammar options as ours (structured.grammar.JSON_DEFAULTS), numpy bitmask: the thinnest path
    XGrammar          xgrammar's GrammarCompiler (cache off, strict_mode=False so additionalProperties keeps JSON
                      Schema's meaning) and GrammarMatcher on the `transformers` tokenizer of the same file
    walk(engine, grammar, tokens)  per token: fill the mask (timed), check the token's bit, accept it;
                      at the end "may stop" is the engine's accepting state
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from tinystack.infer.structured.grammar import JSON_DEFAULTS

COMPILE_TIMEOUT_S = 5.0  # InferConfig.structured_compile_timeout_s's default: what the engine would wait


class Case(NamedTuple):
    file: str
    description: str
    schema: Any
    tests: list[dict]  # {"description"?, "data", "valid"}


def load_cases(root: Path) -> list[Case]:
    cases = []
    for path in sorted(root.rglob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        rel = str(path.relative_to(root))
        if isinstance(doc, dict) and "schema" in doc and "tests" in doc:  # MaskBench: one schema per file
            cases.append(Case(rel, doc.get("description", rel), doc["schema"], doc["tests"]))
        elif isinstance(doc, list):
            cases += [Case(rel, g.get("description", ""), g["schema"], g["tests"]) for g in doc]
    return cases


def serialise(data: Any) -> str:
    """Compact JSON, non-ASCII as UTF-8 (what a model writes), not \\u escapes."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


class Refused(Exception):
    """The engine would not compile this schema."""


@contextlib.contextmanager
def quiet_stderr():
    """File descriptor 2 to /dev/null for the block: xgrammar's C++ logs a warning line per unsupported keyword."""
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _bit(words: np.ndarray, token: int) -> bool:
    return bool((int(words[token >> 5]) >> (token & 31)) & 1)


class Ours:
    name = "tinystack"

    def __init__(self, tokenizer):
        import torch

        from tinystack.infer.structured import grammar as grammar_mod
        from tinystack.infer.structured.tokenizer import llg_tokenizer

        self.tok, self._cache = tokenizer, grammar_mod._cache
        llg_tokenizer(tokenizer)  # the bridge is built once per tokenizer: not part of any schema's first mask
        self.bitmask = torch.full((1, (tokenizer.vocab_size + 31) // 32), -1, dtype=torch.int32)
        self.words = self.bitmask.numpy()[0]  # the same memory

    def compile(self, schema: Any):
        from tinystack.infer.structured import GrammarError, Matcher, compile_grammar
        from tinystack.sampling_params import StructuredOutputs

        self._cache.clear()
        try:
            so = StructuredOutputs(json=schema)
            return compile_grammar(so, self.tok, COMPILE_TIMEOUT_S), Matcher
        except (GrammarError, ValueError, TypeError) as e:
            raise Refused(str(e)) from None

    def matcher(self, grammar):
        compiled, cls = grammar
        return cls(compiled)

    def fill(self, m) -> np.ndarray:
        m.fill_bitmask(self.bitmask, 0)
        return self.words

    def accept(self, m, token: int) -> bool:
        return m.accept(token)

    def may_stop(self, m) -> bool:
        return m.is_accepting()


class LlgDirect:
    name = "llguidance"

    def __init__(self, tokenizer_json: Path, eos: list[int], vocab_size: int):
        import llguidance
        import llguidance.numpy as llg_np

        self.llg, self.llg_np = llguidance, llg_np
        self.lltok = llguidance.LLTokenizer(tokenizer_json.read_text(encoding="utf-8"), n_vocab=vocab_size,
                                            eos_token=eos)
        self.bitmask = llg_np.allocate_token_bitmask(1, self.lltok.vocab_size)

    def compile(self, schema: Any):
        try:
            text = self.llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_DEFAULTS)
        except (ValueError, TypeError, KeyError, AssertionError) as e:
            raise Refused(str(e)) from None
        m = self.llg.LLMatcher(self.lltok, text, log_level=0)
        if m.is_error():
            raise Refused(m.get_error())
        return m

    def matcher(self, grammar):
        return grammar.deep_copy()

    def fill(self, m) -> np.ndarray:
        self.llg_np.fill_next_token_bitmask(m, self.bitmask, 0)
        return self.bitmask[0]

    def accept(self, m, token: int) -> bool:
        return m.consume_token(token)

    def may_stop(self, m) -> bool:
        return m.is_accepting()


class XGrammar:
    name = "xgrammar"

    def __init__(self, model_dir: Path, eos: list[int], vocab_size: int):
        import transformers
        import xgrammar as xgr

        hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json"))
        info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size, stop_token_ids=eos)
        self.xgr = xgr
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=False)
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self.words = self.bitmask.numpy()[0]

    def compile(self, schema: Any):
        try:
            with quiet_stderr():
                return self.compiler.compile_json_schema(json.dumps(schema), strict_mode=False)
        except Exception as e:  # xgrammar raises RuntimeError / ValueError / its own types
            raise Refused(f"{type(e).__name__}: {e}") from None

    def matcher(self, grammar):
        return self.xgr.GrammarMatcher(grammar)

    def fill(self, m) -> np.ndarray:
        m.fill_next_token_bitmask(self.bitmask, 0)
        return self.words

    def accept(self, m, token: int) -> bool:
        return m.accept_token(token)

    def may_stop(self, m) -> bool:
        return m.is_completed()


def first_mask(engine, schema: Any) -> tuple[Any, float]:
    """(compiled grammar, seconds to compile it, make a matcher and fill the first mask); Refused passes through."""
    t0 = time.perf_counter()
    grammar = engine.compile(schema)
    engine.fill(engine.matcher(grammar))
    return grammar, time.perf_counter() - t0


class Walk(NamedTuple):
    accepted: bool  # every token allowed and accepted, and the matcher may stop at the end
    refused_at: int | None  # index of the first token refused (== len(tokens): may not stop at the end)
    how: str  # "ok", "mask" (its bit was clear), "accept" (bit set but accept said no: an inconsistency), "end"
    mask_s: list[float]  # wall seconds of each fill
    mask_cpu_s: list[float]  # this thread's CPU seconds of each fill (every engine fills on the calling thread):
    # what load on a shared machine does not inflate


def walk(engine, grammar, tokens: list[int]) -> Walk:
    m = engine.matcher(grammar)
    times, cpu = [], []
    for i, t in enumerate(tokens):
        c0, t0 = time.thread_time(), time.perf_counter()
        words = engine.fill(m)
        times.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
        if not _bit(words, t):
            return Walk(False, i, "mask", times, cpu)
        if not engine.accept(m, t):
            return Walk(False, i, "accept", times, cpu)
    ok = engine.may_stop(m)
    return Walk(ok, None if ok else len(tokens), "ok" if ok else "end", times, cpu)


def engine_mask_step(tok, rows: int, threads: int, reps: int = 30) -> dict:
    """What the engine pays per step for `rows` constrained rows beyond the masks themselves: BatchMasker.start
    (the fill, on its worker thread) and BatchMasker.apply (the bitmask unpacked and the logits [rows, V] masked),
    with torch at `threads` intra-op threads; median ms over `reps` calls, the fill waited for before apply."""
    import torch

    from tinystack.infer.structured import BatchMasker, Matcher, compile_grammar
    from tinystack.sampling_params import StructuredOutputs

    grammar = compile_grammar(StructuredOutputs(json={"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}}}), tok, COMPILE_TIMEOUT_S)
    matchers = [Matcher(grammar) for _ in range(rows)]
    masker, logits = BatchMasker(tok.vocab_size, rows), torch.randn(rows, tok.vocab_size)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    fills, applies = [], []
    try:
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            future = masker.start(matchers)
            future.result()
            t1 = time.perf_counter()
            masker.apply(logits, list(range(rows)), future)
            fills.append(t1 - t0)
            applies.append(time.perf_counter() - t1)
    finally:
        torch.set_num_threads(before)
    med = sorted(fills[1:])[reps // 2], sorted(applies[1:])[reps // 2]
    return {"rows": rows, "torch_threads": threads, "fill_ms_p50": round(med[0] * 1e3, 3),
            "apply_ms_p50": round(med[1] * 1e3, 3)}
