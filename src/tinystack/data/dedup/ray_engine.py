"""Near dedup on Ray Data: the same survivors as `NearDedup`, computed on a cluster.

Optional: needs the ``[dist]`` extra (``ray[data]``). `RayNearDedup` is a drop-in for
`NearDedup` (``prepare(..., engine="ray")``, ``tinystack data dedup --engine ray``);
only the two parallel stages move to Ray:

1. **signatures** -- the texts to sign are written to a JSONL file that
   `ray.data.read_json` splits into blocks, and ``map_batches`` computes the MinHash
   signatures and the LSH band keys of each block (the same `MinHasher`/`band_keys`
   code, so the values are bit-identical to the local path);
2. **candidate pairs** -- the band keys are exploded to (band, key, row) rows and
   grouped on (band, key) with ``groupby().map_groups``; each bucket emits its pairs
   with the same rule as `lsh.candidate_pairs` (all pairs up to `MAX_BUCKET_PAIRS`
   members, a star from the smallest row beyond).

Verification, connected components (union-find) and the survivor choice then run on
the driver exactly as in `NearDedup`, over the collected signatures (the index) and
the candidate pairs, so both engines give the same clusters and survivors.

`address`: ``"local"`` or None starts (or reuses) a Ray instance in this process,
``"auto"`` joins a running cluster, ``"ray://host:port"`` a remote one.
"""
from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from tinystack.data.dedup.lsh import MAX_BUCKET_PAIRS, band_keys
from tinystack.data.dedup.minhash import MinHasher
from tinystack.data.dedup.near_duplicates import NearDupParams, estimate_pairs, verify_pairs
from tinystack.data.dedup.near_step import NearDedup
from tinystack.errors import require


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> Any:
    """Import Ray and connect/start it once; a clear error when the extra is missing."""
    ray = require("ray", "dist", "data.engine = 'ray'")
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                  "logging_level": logging.WARNING}
        if address not in (None, "local"):
            kwargs["address"] = address
        elif num_cpus:
            kwargs["num_cpus"] = num_cpus
        ray.init(**kwargs)
    import ray.data

    logging.getLogger("ray.data").setLevel(logging.WARNING)  # per-dataset INFO lines drown the summary
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # our own bar and summary table report progress
    ctx.print_on_execution_start = False
    return ray


def _sign(batch: dict[str, np.ndarray], params: NearDupParams) -> dict[str, np.ndarray]:
    sigs = MinHasher(params.minhash).signatures([str(t) for t in batch["text"]])
    b, r = params.bands
    return {"row": batch["row"].astype(np.int64), "sig": sigs, "keys": band_keys(sigs, b, r)}


def _explode(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    keys = np.asarray(batch["keys"])
    n, b = keys.shape
    return {"band": np.tile(np.arange(b, dtype=np.int64), n), "key": keys.reshape(-1),
            "row": np.repeat(batch["row"], b)}


def _bucket(group: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    m = np.sort(np.asarray(group["row"], dtype=np.int64))
    if len(m) < 2:
        return {"a": np.zeros(0, np.int64), "b": np.zeros(0, np.int64)}
    a, b = [np.full(len(m) - 1, m[0])], [m[1:]]  # star from the smallest row
    if len(m) <= MAX_BUCKET_PAIRS:
        i, j = np.triu_indices(len(m) - 1, k=1)
        a.append(m[1:][i])
        b.append(m[1:][j])
    return {"a": np.concatenate(a), "b": np.concatenate(b)}


class RayNearDedup(NearDedup):
    """`NearDedup` with signatures and candidate grouping on Ray Data."""

    def __init__(self, params: NearDupParams | None = None, *, exact: bool = True, address: str | None = None,
                 on_removed: Callable[..., None] | None = None, batch_size: int = 512) -> None:
        super().__init__(params, exact=exact, on_removed=on_removed)
        self.address, self.batch_size = address, batch_size

    def _pairs(self, batches: Iterator[list[str]], rows_ready: Callable[[], np.ndarray],
               texts_of: Callable[[np.ndarray], dict[int, str]] | None) -> np.ndarray:
        ray = ensure_ray(self.address)
        P = self.params.num_perm
        with tempfile.TemporaryDirectory(prefix="tinystack-ray-") as tmp:
            path = Path(tmp) / "texts.jsonl"
            n = 0
            with open(path, "w", encoding="utf-8") as f:
                for batch in batches:
                    for t in batch:
                        f.write(json.dumps({"row": n, "text": t}, ensure_ascii=False) + "\n")
                        n += 1
            rows_ready()
            if n == 0:
                return np.zeros((0, 2), dtype=np.int64)
            signed = (ray.data.read_json(str(path))
                      .map_batches(_sign, fn_kwargs={"params": self.params}, batch_size=self.batch_size,
                                   batch_format="numpy")
                      .materialize())
            sigs = np.zeros((n, P), dtype=np.uint32)
            for b in signed.select_columns(["row", "sig"]).iter_batches(batch_format="numpy"):
                sigs[b["row"]] = np.asarray(b["sig"], dtype=np.uint32)  # the index, on the driver
            self.signatures = sigs  # kept for reuse, as in NearDedup
            cand = (signed.select_columns(["row", "keys"]).map_batches(_explode, batch_format="numpy")
                    .groupby(["band", "key"]).map_groups(_bucket, batch_format="numpy"))
            parts = [np.stack([np.asarray(b["a"]), np.asarray(b["b"])], axis=1)
                     for b in cand.iter_batches(batch_format="numpy") if len(b["a"])]
        if not parts:
            return np.zeros((0, 2), dtype=np.int64)
        pairs = np.concatenate(parts).astype(np.int64)
        code = np.unique(pairs[:, 0] * np.int64(n) + pairs[:, 1])
        pairs = np.stack([code // n, code % n], axis=1)
        pairs, _ = verify_pairs(pairs, estimate_pairs(sigs, sigs, pairs), self.params, texts_of)
        return pairs
