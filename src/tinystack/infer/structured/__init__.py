"""Structured outputs: constrain what a request generates to a JSON Schema, a regex, a choice or a grammar.

llguidance is the grammar engine (its JSON Schema, regex and Lark compilers and its token matcher); what is ours
is the integration:

    tokenizer.py  our tokenizers' exact token bytes -> llguidance's tokenizer (built once per tokenizer)
    grammar.py    SamplingParams.structured_outputs -> a checked grammar, compiled with a time limit, cached
    matcher.py    Matcher: one request's state (mask, accept, may stop, forced tokens, reset);
                  BatchMasker: a step's masks computed while the forward runs, applied in one operation

The engine (llm_engine.py) gives each constrained request a Matcher when it is added, masks that request's
logits every step, feeds each sampled token to its matcher, stops when the matcher is complete and nothing but
EOS can follow, and appends the tokens the grammar forces without sampling them (fast-forward; the next step
feeds them as a chunk). Constrained rows never speculate.
"""
from tinystack.infer.structured.grammar import CompiledGrammar, GrammarError, compile_grammar
from tinystack.infer.structured.matcher import BatchMasker, Matcher
from tinystack.infer.structured.tokenizer import UnsupportedTokenizer

__all__ = ["BatchMasker", "CompiledGrammar", "GrammarError", "Matcher", "UnsupportedTokenizer", "compile_grammar"]
