"""`NearDedup`: the dedup step of the pipeline: exact + MinHash-LSH near duplicates,
clustered, one survivor per cluster, a ``cluster_id`` on every record.

Flow (memory: the signature index only; records wait in an on-disk `Spool`):

    pass 1  stream in -> spool; records `BATCH` at a time: their canonical texts
            (`shingles.canonical_batch`, once per text), the exact key of each
            (`exact.exact_key`: SHA-256 of the canonical text); the first record of
            each exact key gets a signature of the same canonical text, case-folded
            (batches of `BATCH` texts, over `workers` processes when > 1; same output
            either way, signatures are pure functions of the text)
    then    LSH candidates -> verified pairs (`near_duplicates.find_pairs`; exact Jaccard
            re-reads only the texts of candidate pairs from the spool) -> union-find;
            an exact duplicate is unioned with its first copy, so it shares its cluster
    pass 2  spool -> records in input order; the cluster root (smallest index) is kept,
            the rest are dropped as ``exact_duplicate`` / ``near_duplicate`` and handed
            to `on_removed` (the `dedup` command writes them to duplicates.jsonl)

``cluster_id`` is the 0-based position, in this step's input, of the cluster's
survivor: deterministic for a given input order, and equal for all members.
``stats.extra``: clusters (with >= 2 members), candidate_pairs, verified_pairs, bands.

After the run the step still holds the signatures (``signatures``: one row per
signed record; ``signature_rows``: the input position of each row), so `prepare`
can build its leakage index from them instead of hashing the texts again
(`take_signatures` hands them over and forgets them). Per-record bookkeeping is in
typed arrays (8 bytes a record), not lists of Python ints (~36 bytes).
"""
from __future__ import annotations

import hashlib
import itertools
import tempfile
from array import array
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Iterable, Iterator

import numpy as np

from tinystack.data.dedup.minhash import MinHasher
from tinystack.data.dedup.near_duplicates import NearDupParams, cluster_roots, find_pairs
from tinystack.data.dedup.shingles import canonical_batch, fold_canonical
from tinystack.data.io.records import Record
from tinystack.data.io.spool import Spool
from tinystack.data.steps import StepStats

BATCH = 512  # texts per signature batch (and per task sent to a worker)


def _chunks(records: Iterable[Record], size: int) -> Iterator[list[Record]]:
    it = iter(records)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def _signatures(args: tuple[NearDupParams, list[str]]) -> np.ndarray:
    params, canon = args
    return MinHasher(params.minhash).signatures_canonical(canon)


def signature_batches(canon: Iterable[list[str]], params: NearDupParams, workers: int = 1) -> Iterator[np.ndarray]:
    """Signatures of each batch of canonical texts (`canonical_batch` with the params'
    ``casefold``), in order; `workers` > 1 uses a process pool."""
    if workers <= 1:
        hasher = MinHasher(params.minhash)
        for batch in canon:
            yield hasher.signatures_canonical(batch)
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        yield from pool.map(_signatures, ((params, b) for b in canon), chunksize=1)


class NearDedup:
    """Pipeline step (same protocol as `Step`: call it on a record stream)."""

    name = "near_dedup"

    def __init__(self, params: NearDupParams | None = None, *, exact: bool = True, workers: int = 1,
                 on_removed: Callable[[Record], None] | None = None,
                 progress: Callable[[int], None] | None = None) -> None:
        self.params = params or NearDupParams()
        self.exact, self.workers, self.on_removed, self.progress = exact, workers, on_removed, progress
        self.stats = StepStats(self.name)
        self.roots: np.ndarray | None = None
        self.signatures: np.ndarray | None = None  # (signed records, num_perm), kept after the run
        self.signature_rows: np.ndarray | None = None  # input position of each signature row

    def take_signatures(self) -> tuple[np.ndarray, np.ndarray]:
        """(signatures, signature_rows) of the last run; the step drops its references."""
        if self.signatures is None or self.signature_rows is None:
            raise RuntimeError("near dedup has not run (or its signatures were taken)")
        out = (self.signatures, self.signature_rows)
        self.signatures = self.signature_rows = None
        return out

    def _pass1(self, records: Iterable[Record], spool: Spool, first_of: array) -> Iterator[list[str]]:
        """Spool records; yield batches of the canonical texts that need a signature.

        Records are taken `BATCH` at a time so that canonicalisation runs once per batch
        (`canonical_batch`): the exact key hashes the case-kept canonical text, the
        signature the same text case-folded (`fold_canonical`), so each text is
        normalised once, not twice, and never one NumPy pass per short text."""
        seen: dict[bytes, int] = {}
        out: list[str] = []
        fold = self.params.casefold
        sha256 = hashlib.sha256
        n = 0
        for chunk in _chunks(records, BATCH):
            for r in chunk:
                spool.append(r)
            canon = canonical_batch([r.text for r in chunk], casefold=False)
            for c in canon:
                if self.exact:  # 128 bits of exact_key, as in ExactDedup
                    first = seen.setdefault(sha256(c.encode("utf-8")).digest()[:16], n)
                    first_of.append(first)
                    if first != n:
                        n += 1
                        continue
                else:
                    first_of.append(n)
                n += 1
                out.append(fold_canonical(c) if fold else c)
                if len(out) == BATCH:
                    yield out
                    out = []
            if self.progress:
                self.progress(n)
        if out:
            yield out

    def _pairs(self, batches: Iterator[list[str]], rows_ready: Callable[[], np.ndarray],
               texts_of: Callable[[np.ndarray], dict[int, str]] | None) -> np.ndarray:
        """Verified pairs of signature rows. `batches` (the texts to sign, in order) must be
        consumed before `rows_ready()` (row -> record index) and `texts_of` are usable."""
        P = self.params.num_perm
        # Batches go to a temporary file and come back as one array: a list of blocks
        # plus their concatenation would hold the index twice (and freed blocks stay
        # in the heap, so the peak RSS would keep both).
        with tempfile.TemporaryFile() as f:
            n = 0
            for sig in signature_batches(batches, self.params, self.workers):
                f.write(np.ascontiguousarray(sig, dtype=np.uint32).tobytes())
                n += len(sig)
            rows_ready()
            f.seek(0)
            self.signatures = sigs = np.fromfile(f, dtype=np.uint32, count=n * P).reshape(n, P)
        pairs, _ = find_pairs(sigs, self.params, texts_of, self.stats.extra)
        return pairs

    def __call__(self, records: Iterable[Record]) -> Iterator[Record]:
        spool = Spool()
        try:
            first_of = array("q")  # record index -> index of its first exact copy
            rows = np.zeros(0, dtype=np.int64)  # signature row -> record index

            def rows_ready() -> np.ndarray:
                nonlocal rows
                firsts = np.array(first_of, dtype=np.int64)
                rows = self.signature_rows = np.flatnonzero(firsts == np.arange(len(firsts)))
                return rows

            def texts_of(ix: np.ndarray) -> dict[int, str]:  # signature rows -> texts, from the spool
                got = spool.texts(set(rows[ix].tolist()))
                return {int(j): got[int(rows[j])] for j in ix}

            pairs = self._pairs(self._pass1(records, spool, first_of), rows_ready,
                                texts_of if self.params.verify == "exact" else None)
            n = len(spool)
            firsts = np.array(first_of, dtype=np.int64)
            all_pairs = np.concatenate([rows[pairs].reshape(-1, 2),
                                        np.stack([firsts, np.arange(n)], axis=1)[firsts != np.arange(n)]])
            self.roots = roots = cluster_roots(n, all_pairs)
            sizes = np.bincount(roots, minlength=n)
            b, r = self.params.bands
            self.stats.extra.update(clusters=int((sizes >= 2).sum()), verified_pairs=int(len(pairs)),
                                    signatures=int(len(rows)), bands=b, rows=r, threshold=self.params.threshold)
            # per record: plain Python values (indexing a NumPy array per scalar is slower than a list)
            for i, (rec, root, first) in enumerate(zip(spool, roots.tolist(), firsts.tolist())):
                self.stats.n_in += 1
                rec.extra = {**rec.extra, "cluster_id": root}  # a fresh dict: extras may be shared objects
                if root == i:
                    self.stats.kept += 1
                    yield rec
                    continue
                reason = "exact_duplicate" if first != i else "near_duplicate"
                self.stats.dropped[reason] += 1
                self.stats.add_example(rec, reason)
                if self.on_removed:
                    self.on_removed(rec)
        finally:
            spool.close()
