"""One request's constraint state (Matcher) and the engine's batched masks (BatchMasker).

The public, token-by-token API (what a benchmark or another engine drives):

    grammar = compile_grammar(StructuredOutputs(json=schema), tokenizer, timeout_s)   # once, cached
    m = Matcher(grammar)                                                              # per request
    m.fill_bitmask(bitmask, row)   # allowed next tokens: bit t of bitmask[row] (int32 words, 32 tokens each)
    m.accept(token) -> bool        # advance; False = the token was not allowed (the matcher is then in error)
    m.is_accepting()               # the output so far is complete: the request may stop here
    m.is_stopped()                 # nothing but stopping is possible
    m.forced_tokens() -> [ids]     # tokens the grammar forces next (fast-forward), not yet accepted
    m.reset()                      # back to the start

The engine does not call fill_bitmask row by row: BatchMasker fills every constrained row of a step in one call
on a worker thread (llguidance's parallel executor, which drops the GIL) while the model's forward runs, and
`apply` masks those rows of the logits in one vectorised operation; unconstrained rows are never touched.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import llguidance
import numpy as np
import torch

from tinystack.infer.structured.grammar import CompiledGrammar


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def _check(bitmask: torch.Tensor) -> None:
    """llguidance writes through a raw pointer: the tensor must be what it expects, or memory is overwritten.
    (Not llguidance.torch's helpers: that module compiles a kernel with torch.compile at import, which pulls
    in torch's inductor and its optional dependencies.)"""
    if bitmask.dtype != torch.int32 or bitmask.device.type != "cpu" or bitmask.dim() != 2 \
            or not bitmask.is_contiguous():
        raise ValueError("a bitmask is a contiguous int32 CPU tensor [rows, (vocab + 31) // 32]")


class Matcher:
    """A request's position in its constraint (see the module docstring for the calls)."""

    def __init__(self, grammar: CompiledGrammar):
        self.grammar = grammar
        self.ll = grammar.new_matcher()

    def fill_bitmask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        _check(bitmask)
        target = bitmask[row]
        self.ll.unsafe_compute_mask_ptr(target.data_ptr(), target.numel() * 4)

    def accept(self, token: int) -> bool:
        return self.ll.consume_token(token)

    def is_accepting(self) -> bool:
        return self.ll.is_accepting()

    def is_stopped(self) -> bool:
        return self.ll.is_stopped()

    def is_error(self) -> bool:
        return self.ll.is_error()

    def error(self) -> str:
        return self.ll.get_error()

    def forced_tokens(self) -> list[int]:
        return self.ll.compute_ff_tokens()

    def reset(self) -> None:
        self.ll.reset()


class BatchMasker:
    """The engine's masks: `start(matchers)` computes the next-token bitmask of each on a worker thread (while
    the forward runs), `apply(logits, rows, future)` waits for it and sets every disallowed logit of those rows to
    -inf. Tokens the model has and the tokenizer does not (a padded embedding) are never allowed. Bit t of a row
    is bit t % 32 of its int32 word t // 32 (llguidance's layout), i.e. little-endian bytes, bits low first."""

    def __init__(self, vocab_size: int, max_rows: int):
        self.vocab_size = vocab_size
        self.bitmask = torch.full((max_rows, bitmask_words(vocab_size)), -1, dtype=torch.int32)
        self._shifts = torch.arange(32, dtype=torch.int32)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tinystack-mask")
        self._executor = llguidance.LLExecutor()

    def start(self, matchers: list[Matcher]) -> Future:
        if len(matchers) > self.bitmask.shape[0]:
            self.bitmask = torch.full((len(matchers), self.bitmask.shape[1]), -1, dtype=torch.int32)
        return self._pool.submit(self._fill, matchers)

    def _fill(self, matchers: list[Matcher]) -> torch.Tensor:
        out = self.bitmask[: len(matchers)]
        if len(matchers) == 1:  # no executor hand-off for one row
            matchers[0].fill_bitmask(out, 0)
        else:
            self._executor.unsafe_compute_mask_ptr([(m.ll, i) for i, m in enumerate(matchers)], out.data_ptr(),
                                                   out.shape[1] * 4, out.shape[0])
        return out

    def apply(self, logits: torch.Tensor, rows: list[int], future: Future) -> torch.Tensor:
        """Set every disallowed logit of rows `rows` (in the order the matchers were given to start) to -inf, in
        place; float32 logits [B, V] (the engine's rows picked for sampling: a tensor of their own).

        NumPy, one thread: unpacking the bits is a byte-table lookup (np.unpackbits) and the fill one masked copy
        per row, about 50 k elements; torch's element-wise ops on the broadcast bit shapes were tens of times
        slower, and its thread pool stalls when other processes hold the cores."""
        words = future.result()
        x = logits.numpy()
        vocab = min(x.shape[1], self.vocab_size)
        bits = np.unpackbits(words.numpy().view(np.uint8), axis=1, count=vocab, bitorder="little")
        for k, r in enumerate(rows):
            np.copyto(x[r, :vocab], -np.inf, where=bits[k] == 0)
            x[r, vocab:] = -np.inf  # ids the model has and the tokenizer does not
        return logits
