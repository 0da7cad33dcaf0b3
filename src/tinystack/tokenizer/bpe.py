"""BPETokenizer: byte-level BPE -- train, encode, decode, save, load.

Contract:
  * Every string round-trips: decode(encode(s)) == s for any str that is valid
    Unicode (lone surrogates cannot be UTF-8 encoded and raise). There is no
    unknown token: the 256 byte values are the base vocabulary.
  * Ids: 0..255 are the bytes (id == byte value), 256.. the merges in the order
    they were learned (id 256 + rank), then the special tokens. vocab_size counts
    all three.
  * encode == tiktoken with the same ranks == HF `tokenizers` on our saved
    tokenizer.json (tested).
  * Pure Python + `regex`; no tokenizer library is used at runtime.

Encoding: cut out allowed specials -> regex pre-split (pretokenize.py) -> BPE
inside each piece, applying the lowest-rank merge present until none applies.
Each piece's ids are cached, so common words cost one dict lookup.
"""
from __future__ import annotations

import hashlib
import heapq
import json
from collections import Counter
from pathlib import Path
from typing import AbstractSet, Callable, Iterable, Literal, Mapping, Sequence

from tinystack.atomic import atomic_open, write_json
from tinystack.tokenizer.hf_format import from_hf_json, to_hf_json
from tinystack.tokenizer.pretokenize import PATTERN, compile_pattern, split_specials
from tinystack.tokenizer.train import learn_merges, merge_word

EOT = "<|endoftext|>"
TOKENIZER_FILE = "tokenizer.json"
_CACHE_MAX = 200_000  # pieces; cleared wholesale when full (cheaper than LRU bookkeeping)
_LONG_PIECE = 128  # pieces longer than this use the O(n log n) heap merge


class BPETokenizer:
    """A byte-level BPE tokenizer. Build with `train` or `load`, not usually by hand.

    `vocab[i]` is the bytes of token i (no specials; must start with the 256 single
    bytes in byte order and hold each byte string once), `merges` the rank-ordered
    id pairs (merge r creates the token whose bytes are vocab[a] + vocab[b]), and
    `special_tokens` maps strings to the ids right after the vocab.
    """

    def __init__(
        self,
        vocab: Sequence[bytes],
        merges: Sequence[tuple[int, int]],
        special_tokens: Mapping[str, int],
        pattern: str = PATTERN,
    ) -> None:
        if len(vocab) < 256 or any(vocab[i] != bytes([i]) for i in range(256)):
            raise ValueError("vocab must start with the 256 single bytes, id == byte value")
        self._vocab: list[bytes] = list(vocab)
        bytes_to_id = {bs: i for i, bs in enumerate(self._vocab)}
        if len(bytes_to_id) != len(self._vocab):
            raise ValueError("vocab holds the same byte string twice")
        self._merges: list[tuple[int, int]] = [(int(a), int(b)) for a, b in merges]
        # (a, b) -> rank, and (a, b) -> id of the merged token.
        self._ranks: dict[tuple[int, int], int] = {}
        self._merged: dict[tuple[int, int], int] = {}
        for rank, (a, b) in enumerate(self._merges):
            z = bytes_to_id.get(self._vocab[a] + self._vocab[b])
            if z is None:
                raise ValueError(f"merge {rank} ({a}, {b}) makes a token that is not in the vocab")
            self._ranks[(a, b)] = rank
            self._merged[(a, b)] = z
        self._special: dict[str, int] = dict(special_tokens)
        n = len(self._vocab)
        if sorted(self._special.values()) != list(range(n, n + len(self._special))):
            raise ValueError("special token ids must follow the vocab: len(vocab), len(vocab)+1, ...")
        self._id_to_bytes: list[bytes] = self._vocab + [b""] * len(self._special)
        for s, i in self._special.items():
            self._id_to_bytes[i] = s.encode("utf-8")
        self.pattern = pattern
        self._regex = compile_pattern(pattern)
        self._cache: dict[str, list[int]] = {}

    # ------------------------------------------------------------------ training
    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        vocab_size: int,
        special_tokens: Sequence[str] = (EOT,),
        progress: Callable[[int, int], None] | None = None,
        pattern: str = PATTERN,
    ) -> BPETokenizer:
        """Learn a vocabulary of exactly `vocab_size` ids (256 bytes + merges + specials).

        Deterministic: the result depends only on the multiset of pre-tokens, not on
        text order. Special strings inside `texts` are cut out, never learned from.
        Fewer merges (a smaller vocab) happen only if the corpus runs out of pairs.
        `progress(done, total)` is called every 64 merges and at the end.
        """
        specials = list(dict.fromkeys(special_tokens))
        num_merges = vocab_size - 256 - len(specials)
        if num_merges < 0:
            raise ValueError(f"vocab_size {vocab_size} < 256 bytes + {len(specials)} specials")
        rx, special_set = compile_pattern(pattern), set(specials)
        counts: Counter[str] = Counter()
        for text in texts:
            for seg, is_special in split_specials(text, special_set):
                if not is_special:
                    counts.update(rx.findall(seg))
        # UTF-8 is injective, so distinct pieces stay distinct words.
        merges = learn_merges({w.encode("utf-8"): c for w, c in counts.items()}, num_merges, progress)
        vocab = [bytes([i]) for i in range(256)]
        for a, b in merges:
            vocab.append(vocab[a] + vocab[b])
        special_ids = {s: len(vocab) + k for k, s in enumerate(specials)}
        return cls(vocab, merges, special_ids, pattern)

    # ------------------------------------------------------------------ encoding
    def encode(self, text: str, allowed_special: Literal["all"] | AbstractSet[str] | None = "all") -> list[int]:
        """Text -> ids. Specials in `allowed_special` ("all", a set, or None for none)
        become their single id; any other special string is encoded as plain text."""
        if allowed_special == "all":
            allowed: AbstractSet[str] = self._special.keys()
        else:
            allowed = allowed_special or set()
            unknown = set(allowed) - self._special.keys()
            if unknown:
                raise ValueError(f"not special tokens of this tokenizer: {sorted(unknown)}")
        if not allowed:
            return self.encode_ordinary(text)
        ids: list[int] = []
        for seg, is_special in split_specials(text, allowed):
            if is_special:
                ids.append(self._special[seg])
            else:
                ids.extend(self.encode_ordinary(seg))
        return ids

    def encode_ordinary(self, text: str) -> list[int]:
        """Text -> ids with special strings treated as plain text."""
        ids: list[int] = []
        cache = self._cache
        for piece in self._regex.findall(text):
            toks = cache.get(piece)
            if toks is None:
                toks = self._bpe(piece.encode("utf-8"))
                if len(piece) <= _LONG_PIECE:  # huge pieces rarely repeat; don't pin them in memory
                    if len(cache) >= _CACHE_MAX:
                        cache.clear()
                    cache[piece] = toks
            ids.extend(toks)
        return ids

    def _bpe(self, piece: bytes) -> list[int]:
        """Merge one piece: repeatedly apply the lowest-rank merge present (all of its
        occurrences, left to right) -- the same order training applied them in."""
        ids = list(piece)  # id == byte value
        if len(ids) > _LONG_PIECE:
            return self._bpe_heap(ids)
        ranks, inf = self._ranks, len(self._ranks)
        while len(ids) > 1:
            pair = min(zip(ids, ids[1:]), key=lambda p: ranks.get(p, inf))
            if pair not in ranks:
                break
            ids = merge_word(ids, pair[0], pair[1], self._merged[pair])
        return ids

    def _bpe_heap(self, ids: list[int]) -> list[int]:
        """Same result as the loop in `_bpe`, in O(n log n) instead of O(n^2): a heap
        of (rank, position) over a linked list. Equal ranks pop leftmost first, which
        is exactly the left-to-right scan. Guards against huge pieces (long runs)."""
        ranks, n = self._ranks, len(ids)
        nxt, prv = list(range(1, n + 1)), list(range(-1, n - 1))
        alive = [True] * n
        heap = [(ranks[p], i) for i, p in enumerate(zip(ids, ids[1:])) if p in ranks]
        heapq.heapify(heap)
        while heap:
            rank, i = heapq.heappop(heap)
            j = nxt[i]
            if not alive[i] or j >= n or ranks.get((ids[i], ids[j])) != rank:
                continue  # stale: a neighbour merged since this entry was pushed
            ids[i] = self._merged[(ids[i], ids[j])]
            alive[j] = False
            nxt[i] = nxt[j]
            if nxt[i] < n:
                prv[nxt[i]] = i
                r = ranks.get((ids[i], ids[nxt[i]]))
                if r is not None:
                    heapq.heappush(heap, (r, i))
            if prv[i] >= 0:
                r = ranks.get((ids[prv[i]], ids[i]))
                if r is not None:
                    heapq.heappush(heap, (r, prv[i]))
        return [t for t, a in zip(ids, alive) if a]

    # ------------------------------------------------------------------ decoding
    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """Ids -> the exact bytes they stand for (specials as their UTF-8 text)."""
        table = self._id_to_bytes
        try:
            parts = [table[i] for i in ids]
            if parts and min(ids) < 0:  # negative ids would silently index from the end
                raise IndexError
        except (IndexError, TypeError) as e:
            raise ValueError(f"token id out of range [0, {len(table)})") from e
        return b"".join(parts)

    def decode(self, ids: Sequence[int]) -> str:
        """Ids -> text; bytes that are not valid UTF-8 (e.g. a cut multi-byte
        character) become U+FFFD instead of raising."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    # ------------------------------------------------------------------ vocabulary
    @property
    def vocab_size(self) -> int:
        return len(self._id_to_bytes)

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._special)

    @property
    def eos_token_id(self) -> int:
        """Id of "<|endoftext|>"; raises ValueError if this tokenizer has none."""
        if EOT not in self._special:
            raise ValueError(f"this tokenizer has no {EOT} token")
        return self._special[EOT]

    @property
    def merges(self) -> list[tuple[int, int]]:
        return list(self._merges)

    def token_bytes(self, token_id: int) -> bytes:
        return self.decode_bytes([token_id])

    def mergeable_ranks(self) -> dict[bytes, int]:
        """{token bytes: rank} for every non-special token -- tiktoken's format."""
        return {bs: i for i, bs in enumerate(self._vocab)}

    # ------------------------------------------------------------------ persistence
    def to_json_bytes(self) -> bytes:
        """The canonical tokenizer.json content: deterministic for a given tokenizer."""
        obj = to_hf_json(self.pattern, self._vocab, self._merges, self._special)
        return (json.dumps(obj, ensure_ascii=False, indent=2) + "\n").encode("utf-8")

    def fingerprint(self) -> str:
        """SHA-256 hex of `to_json_bytes()` == sha256sum of the saved tokenizer.json."""
        return hashlib.sha256(self.to_json_bytes()).hexdigest()

    def save(self, directory: str | Path) -> Path:
        """Write DIR/tokenizer.json (HF-loadable) and DIR/tokenizer_config.json
        (lets transformers' AutoTokenizer load DIR), atomically. Returns the json path."""
        directory = Path(directory)
        path = directory / TOKENIZER_FILE
        with atomic_open(path, "wb") as f:
            f.write(self.to_json_bytes())
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
        if EOT in self._special:
            config.update(eos_token=EOT, bos_token=EOT)
        write_json(directory / "tokenizer_config.json", config)
        return path

    @classmethod
    def load(cls, path: str | Path) -> BPETokenizer:
        """Load from a directory holding tokenizer.json, or from the file itself."""
        path = Path(path)
        if path.is_dir():
            path = path / TOKENIZER_FILE
        with open(path, encoding="utf-8") as f:
            pattern, vocab, merges, specials = from_hf_json(json.load(f))
        return cls(vocab, merges, specials, pattern)

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size}, merges={len(self._merges)}, specials={list(self._special)})"
