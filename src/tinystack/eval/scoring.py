"""Scoring a model: the one place a next-token loss is measured (evaluation, validation, the gates).

    token_nll(logits, targets)           per-position next-token NLL in nats, IGNORE_INDEX (-100) targets 0
                                         (nn/nll.py, where inference's weight-format perplexity uses it too)
    target_logits(model, x, y)           the forward, the head only where a target is (a chat's prompt has none)
    score_batches(model, batches, ..)    THE scoring function: fixed (x, y) batches -> Score (summed nats,
                                         scored tokens, correct argmaxes, bytes when the tokens' lengths are
                                         known) -> loss, perplexity, bits per byte, accuracy
    window_batches(tokens, T, ..)        a token stream as fixed batches of non-overlapping windows
    score_tokens(model, tokens, ..)      score_batches over window_batches: a split of a token file
    score_documents, target_nats         per-document sums (slices, bad cases) and a target after a context
                                         (the regression cases), from the same token_nll

Callers: `tinystack eval` (offline.window_metrics -> eval.json), the regression and promotion gates (gate.py:
the same window metrics side by side), training's validation (train/loop.py: estimates on a fixed subset of
windows while training, and the final validation loss on eval's own windows, so the two numbers agree),
the NumPy trainer's final validation, and fine-tuning's held-out loss (train/finetune.py). Training's own
step loss (train/loss.lm_loss) is token_nll's mean, computed by fused rows for speed (tested equal).

Windows are deterministic: a token stream is cut into consecutive non-overlapping windows of block_size + 1
tokens (each scores block_size targets); with a cap, evenly spaced ones are kept so the score covers the
whole split. Precision is the caller's: score under an autocast context to score in bf16.

Per-document scoring: each document follows an end-of-text separator and ends with one, so its targets are
its tokens plus the closing separator (its bytes: its UTF-8 bytes + 1, as `tinystack.tokenizer.shards`
counts them). A document longer than the context is cut into windows the same way; windows of all
documents are batched longest first and their sums added back to their document, so batch order changes
nothing and the per-document sums add up exactly to the totals.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tinystack.nn.loss import IGNORE_INDEX
from tinystack.nn.nll import token_nll
from tinystack.progress import progress_bar

Batch = tuple[Any, Any]  # x, y: int [B, T] arrays or tensors; y = IGNORE_INDEX where there is no target


def target_logits(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, their targets): the head (the largest matmul, and the softmax over the vocabulary after it) runs
    only at positions with a target when some have none (a chat's prompt tokens), through the models'
    `logit_index` mask; every position otherwise (pretraining)."""
    keep = y != IGNORE_INDEX
    if bool(keep.all()):
        return model(x)[0], y
    return model(x, logit_index=keep)[0], y[keep]


def context_len(model: torch.nn.Module) -> int:
    """Positions the model can see: GPT's block_size, Llama's max_position_embeddings."""
    cfg = model.config
    return int(getattr(cfg, "max_seq_len", None) or cfg.block_size)


@dataclass
class Score:
    """Sums over every scored target of a split; the metrics are derived from them."""

    nats: float  # summed next-token negative log-likelihood (float64)
    tokens: int  # scored targets (IGNORE_INDEX ones are not)
    correct: int  # targets the argmax predicted
    bytes: int | None  # UTF-8 bytes of the scored targets; None when the tokens' lengths were not given
    rows: int  # windows (or padded sequences) scored

    @property
    def loss(self) -> float:
        """Mean next-token NLL in nats per token (NaN when nothing was scored)."""
        return self.nats / self.tokens if self.tokens else float("nan")

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss)

    @property
    def bits_per_byte(self) -> float | None:
        """Total nats / ln 2 / bytes: unlike loss, comparable across tokenizers."""
        return self.nats / math.log(2) / self.bytes if self.bytes else None

    @property
    def accuracy(self) -> float:
        return self.correct / self.tokens if self.tokens else float("nan")

    def to_dict(self) -> dict[str, Any]:
        """The metrics as eval.json holds them per split."""
        out = {"loss": self.loss, "perplexity": self.perplexity, "bits_per_byte": self.bits_per_byte,
               "accuracy": self.accuracy, "tokens": self.tokens, "bytes": self.bytes, "windows": self.rows}
        return {k: v for k, v in out.items() if v is not None}


def window_starts(n_tokens: int, block_size: int, max_windows: int = 0) -> np.ndarray:
    """Start offsets of the non-overlapping windows of block_size + 1 tokens (evenly thinned to max_windows)."""
    starts = np.arange(0, n_tokens - block_size, block_size)
    if max_windows and len(starts) > max_windows:
        starts = starts[np.linspace(0, len(starts) - 1, max_windows).round().astype(int)]
    return starts


def window_batches(tokens: np.ndarray, block_size: int, max_windows: int = 0,
                   batch_size: int = 16) -> list[tuple[np.ndarray, np.ndarray]]:
    """The token stream's windows (window_starts) as fixed batches x, y int64 [<= batch_size, block_size]."""
    starts = window_starts(len(tokens), block_size, max_windows)
    if len(starts) == 0:
        raise ValueError(f"need more than block_size={block_size} tokens to score, got {len(tokens)}")
    out = []
    for b in range(0, len(starts), batch_size):
        win = np.stack([tokens[s:s + block_size + 1] for s in starts[b:b + batch_size]]).astype(np.int64)
        out.append((win[:, :-1], win[:, 1:]))
    return out


@torch.no_grad()
def score_batches(model: torch.nn.Module, batches: Sequence[Batch] | Iterable[Batch],
                  token_nbytes: np.ndarray | None = None, *, device: str | torch.device = "cpu",
                  progress: bool = False, label: str = "eval") -> Score:
    """Score `model` on fixed batches (IGNORE_INDEX targets skipped), in eval mode (its mode is restored after).
    `token_nbytes[id]`: each token's length in bytes, for bits per byte. Under the caller's autocast, if any."""
    was_training = model.training
    model.eval()
    dev = torch.device(device)
    batches = list(batches)
    nats, tokens, correct, nbytes, rows = 0.0, 0, 0, 0, 0
    with progress_bar(label, len(batches), progress) as advance:
        for xb, yb in batches:
            x, y = torch.as_tensor(xb).to(dev), torch.as_tensor(yb).to(dev)
            logits, t = target_logits(model, x, y)
            logits, t = logits.reshape(-1, logits.size(-1)), t.reshape(-1)
            keep = t != IGNORE_INDEX
            nats += float(token_nll(logits, t).double().sum())
            tokens += int(keep.sum())
            correct += int(((logits.argmax(dim=-1) == t) & keep).sum())
            if token_nbytes is not None:
                nbytes += int(token_nbytes[t[keep].cpu().numpy()].sum())
            rows += len(x)
            advance(1)
    model.train(was_training)
    return Score(nats, tokens, correct, nbytes if token_nbytes is not None else None, rows)


def score_tokens(model: torch.nn.Module, tokens: np.ndarray, token_nbytes: np.ndarray | None = None, *,
                 max_windows: int = 0, batch_size: int = 16, device: str | torch.device = "cpu",
                 progress: bool = False, label: str = "eval") -> Score:
    """Score a token stream (a split's .bin) on its fixed windows: score_batches(window_batches(...))."""
    batches = window_batches(tokens, context_len(model), max_windows, batch_size)
    return score_batches(model, batches, token_nbytes, device=device, progress=progress, label=label)


@dataclass
class DocScores:
    """Per-document sums (one entry per scored document, in input order)."""

    nats: np.ndarray  # float64: summed next-token negative log-likelihood
    tokens: np.ndarray  # int64: scored targets (document tokens + the closing separator)
    bytes: np.ndarray  # int64: UTF-8 bytes + 1 for the separator
    correct: np.ndarray  # int64: targets the argmax predicted

    def __len__(self) -> int:
        return len(self.nats)

    @property
    def loss(self) -> np.ndarray:
        """Mean nats per token of each document."""
        return self.nats / np.maximum(self.tokens, 1)


def document_ids(tokenizer, text: str) -> list[int]:
    """separator + the text's tokens + separator: the context and targets of one document."""
    eos = tokenizer.eos_token_id
    return [eos, *tokenizer.encode_ordinary(text), eos]


def _windows(ids_per_doc: Sequence[Sequence[int]], block_size: int) -> list[tuple[int, list[int]]]:
    out = []
    for d, ids in enumerate(ids_per_doc):
        for s in range(0, len(ids) - 1, block_size):
            out.append((d, list(ids[s:s + block_size + 1])))
    return out


@torch.no_grad()
def score_documents(model: torch.nn.Module, ids_per_doc: Sequence[Sequence[int]], nbytes: Sequence[int], *,
                    batch_size: int = 16, device: str = "cpu", progress: bool = False,
                    label: str = "eval") -> DocScores:
    """Score documents given as `document_ids` lists; `nbytes[i]` is document i's byte count."""
    model.eval()
    n = len(ids_per_doc)
    nats, tokens, correct = np.zeros(n), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    wins = sorted(_windows(ids_per_doc, context_len(model)), key=lambda w: -len(w[1]))
    with progress_bar(label, len(wins), progress) as advance:
        for b in range(0, len(wins), batch_size):
            batch = wins[b:b + batch_size]
            width = len(batch[0][1]) - 1  # longest first: the first window is the widest
            x = torch.zeros((len(batch), width), dtype=torch.long)
            y = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)
            for i, (_, w) in enumerate(batch):
                x[i, :len(w) - 1] = torch.tensor(w[:-1])
                y[i, :len(w) - 1] = torch.tensor(w[1:])
            x, y = x.to(device), y.to(device)
            logits, _ = model(x)
            nll = token_nll(logits, y)
            hit = (logits.argmax(dim=-1) == y) & (y != IGNORE_INDEX)
            doc = np.array([d for d, _ in batch])
            np.add.at(nats, doc, nll.sum(dim=1).double().cpu().numpy())
            np.add.at(tokens, doc, (y != IGNORE_INDEX).sum(dim=1).cpu().numpy())
            np.add.at(correct, doc, hit.sum(dim=1).cpu().numpy())
            advance(len(batch))
    return DocScores(nats, tokens, np.asarray(nbytes, dtype=np.int64), correct)


@torch.no_grad()
def target_nats(model: torch.nn.Module, context: Sequence[int], target: Sequence[int],
                device: str = "cpu") -> np.ndarray:
    """Per-token negative log-likelihood of `target` following `context` (context cut from the left to fit)."""
    if not target:
        raise ValueError("empty target")
    T = context_len(model)
    if len(target) > T:
        raise ValueError(f"target is {len(target)} tokens; the model's context is {T}")
    seq = [*context, *target][-(T + 1):]
    x = torch.tensor([seq[:-1]], device=device)
    y = torch.tensor(seq[1:], device=device)
    logits, _ = model(x)
    nll = token_nll(logits[0], y)
    return nll[-len(target):].double().cpu().numpy()


@torch.no_grad()
def prompt_logprobs(model: torch.nn.Module, ids: Sequence[int], top_n: int
                    ) -> list[tuple[float | None, list[tuple[int, float]]]]:
    """Each token of `ids` scored after the ones before it (token_nll, as every score here): (its logprob, the
    top_n most likely tokens there with theirs); the first token has no context: (None, []). What a completions
    server echoes for lm-evaluation-harness' loglikelihood requests (serve/api/echo.py)."""
    if len(ids) > context_len(model):
        raise ValueError(f"{len(ids)} tokens; the model's context is {context_len(model)}")
    device = next(model.parameters()).device
    x = torch.tensor([list(ids)], device=device)
    logits, _ = model(x)
    logits = logits[0, :-1]
    nll = token_nll(logits, x[0, 1:])
    out: list[tuple[float | None, list[tuple[int, float]]]] = [(None, [])]
    top = logits.float().log_softmax(-1).topk(top_n, dim=-1) if top_n else None
    for t in range(len(ids) - 1):
        alts = list(zip(top.indices[t].tolist(), top.values[t].tolist())) if top is not None else []
        out.append((-float(nll[t]), alts))
    return out
