"""A StructuredOutputs constraint -> a checked llguidance grammar, compiled once per (constraint, tokenizer).

    StructuredOutputs(json= | json_object= | regex= | choice= | grammar= | structural_tag=)
        -> grammar text (llguidance's JSON Schema, regex and Lark front ends; `choice` as a Lark alternation)
        -> LLMatcher built, and its first mask computed, on a worker thread, waited for at most `timeout_s`
           (llguidance drops the GIL while it works, so other requests go on; one that takes longer is refused,
           never waited for)
        -> a CompiledGrammar in an LRU cache keyed by (constraint, tokenizer); each request deep-copies it.

Anything llguidance cannot compile (invalid JSON Schema, an unsupported keyword, a bad regex, a Lark syntax
error) is a GrammarError naming the constraint's kind, with llguidance's own message: the server turns it
into a 400 that names the request field.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import llguidance

from tinystack.infer.structured.tokenizer import llg_tokenizer
from tinystack.sampling_params import StructuredOutputs

CACHE_SIZE = 256  # compiled grammars kept per process
# JSON as the model likes to write it: llguidance's free whitespace (compact, spaced or indented all match).
# Tried: one fixed layout (json.dumps' ", " / ": ", no other whitespace) forces more tokens (bench_structured.py:
# fast-forward cut the time to a 10-key object by 52 % instead of 27 %), but it pushed SmolLM2 off the layout it
# writes and its greedy answers stopped finishing (a string or a number that never closes); items on indented lines
# (item_separator ",\n  ") finish, but the values it writes get worse (BENCHMARKS.md). A schema that wants a fixed
# layout says so itself: "x-guidance": {"whitespace_flexible": false, ...}.
JSON_DEFAULTS: dict[str, Any] = {"whitespace_flexible": True}


class GrammarError(ValueError):
    """A constraint that cannot be compiled: `kind` is the StructuredOutputs field (json, regex, ...)."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind, self.reason = kind, message


def grammar_text(so: StructuredOutputs, special_tokens: dict[str, int] | None = None) -> str:
    """The llguidance grammar for a constraint (not yet checked: compile() checks it)."""
    kind = so.kind
    try:
        if kind == "json":
            return llguidance.LLMatcher.grammar_from_json_schema(so.json, defaults=JSON_DEFAULTS)
        if kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_DEFAULTS)
        if kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(so.regex)
        if kind == "choice":
            # Lark string literals take JSON's escapes, so json.dumps quotes any choice exactly
            return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in so.choice))
        if kind == "grammar":
            return llguidance.LLMatcher.grammar_from_lark(so.grammar)
        return _structural_tag(json.loads(so.structural_tag), special_tokens or {})
    except (ValueError, TypeError, KeyError, AssertionError) as e:
        raise GrammarError(kind, str(e) or type(e).__name__) from None


def _structural_tag(tag: dict, special_tokens: dict[str, int]) -> str:
    """vLLM's structural tag {"structures": [{"begin", "schema", "end"}], "triggers": [...]} as llguidance's
    lazy grammar: free text until a trigger, then begin + JSON matching the schema + end."""
    triggers, structures = tag.get("triggers"), tag.get("structures")
    if not triggers or not structures:
        raise ValueError("a structural tag needs 'triggers' and 'structures'")
    tags = []
    for s in structures:
        trigger = next((t for t in triggers if s["begin"].startswith(t)), None)
        if trigger is None:
            raise ValueError(f"structure begin {s['begin']!r} starts with none of the triggers {triggers}")
        tags.append(llguidance.StructTag(trigger=trigger, begin=s["begin"], grammar=s.get("schema") or {},
                                         end=s.get("end", "")))
    # a trigger that is one special token of this tokenizer (Qwen's <tool_call>) is matched as that token
    special = all(t.trigger in special_tokens for t in tags)
    return llguidance.StructTag.to_grammar(tags, assume_special=special)


class CompiledGrammar:
    """One compiled constraint for one tokenizer; `matcher()` gives a fresh per-request matcher."""

    def __init__(self, so: StructuredOutputs, matcher: llguidance.LLMatcher):
        self.constraint, self._template = so, matcher

    def new_matcher(self) -> llguidance.LLMatcher:
        return self._template.deep_copy()


_cache: OrderedDict[tuple, CompiledGrammar] = OrderedDict()
_lock = threading.Lock()
_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tinystack-grammar")


def compile_grammar(so: StructuredOutputs, tokenizer: Any, timeout_s: float) -> CompiledGrammar:
    """The compiled grammar of `so` for `tokenizer` (one of ours), from the cache or compiled now with at most
    `timeout_s` seconds of waiting. Raises GrammarError. Safe from any thread."""
    key = (so, tokenizer)  # the tokenizer object itself: an id() could be reused once it is gone
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    lltok = llg_tokenizer(tokenizer)
    future = _pool.submit(_build, lltok, so, getattr(tokenizer, "special_tokens", {}))
    try:
        matcher = future.result(timeout=timeout_s)
    except FutureTimeout:
        raise GrammarError(so.kind, f"compiling the constraint took longer than {timeout_s:g} s "
                                    "(infer.structured_compile_timeout_s)") from None
    if matcher.is_error():
        raise GrammarError(so.kind, _first_line(matcher.get_error()))
    compiled = CompiledGrammar(so, matcher)
    with _lock:
        _cache[key] = compiled
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return compiled


def _build(lltok: llguidance.LLTokenizer, so: StructuredOutputs, special: dict[str, int]) -> llguidance.LLMatcher:
    """The grammar text and the matcher, with its first mask computed: llguidance builds lexer states lazily, so
    for a hard schema the first mask is where the work is; doing it here puts that work under the time limit (and
    the states it built are shared by the deep copies each request gets)."""
    matcher = llguidance.LLMatcher(lltok, grammar_text(so, special), log_level=0)
    if not matcher.is_error():
        matcher.compute_bitmask()
    return matcher


def _first_line(message: str) -> str:
    return " ".join(message.split())[:500]
