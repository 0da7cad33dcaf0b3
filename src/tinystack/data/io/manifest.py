"""Hashes and the lineage hash of a prepared data directory.

The manifest (written by `tinystack.data.pipeline.prepare`) records a ``"hash"`` that
identifies the exact train/val/test contents. Later stages (tokenizer, training,
eval) copy it into their own outputs as lineage, and can call `verify_data_dir` to
check the files on disk still match it.

Definition of the hash, so any tool can recompute it:

    hash = sha256( "train.jsonl <sha256 of train.jsonl>\\n"
                   "val.jsonl <sha256 of val.jsonl>\\n"
                   "test.jsonl <sha256 of test.jsonl>\\n" )   (hex digests, UTF-8)

Hashing the per-file digests rather than the concatenated bytes matters: with plain
concatenation, moving the last line of train.jsonl to the start of val.jsonl would
give the same hash although the split changed.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from tinystack.atomic import file_sha256, read_json

SPLIT_FILES = ("train.jsonl", "val.jsonl", "test.jsonl")
MANIFEST = "manifest.json"
FORMAT = "tinystack.data/1"


def combine_hashes(file_hashes: dict[str, str]) -> str:
    """The lineage hash from {file name: hex sha256} for the three split files."""
    blob = "".join(f"{name} {file_hashes[name]}\n" for name in SPLIT_FILES)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def split_files_hash(data_dir: str | Path) -> str:
    """Recompute the lineage hash from the split files on disk."""
    data_dir = Path(data_dir)
    return combine_hashes({name: file_sha256(data_dir / name) for name in SPLIT_FILES})


def verify_data_dir(data_dir: str | Path) -> dict:
    """Load manifest.json and check the split files match its hash; return the manifest.

    Raises FileNotFoundError if the manifest or a split file is missing (e.g. a run
    that crashed before finishing: the manifest is written last) and ValueError if
    the files were changed after the manifest was written.
    """
    data_dir = Path(data_dir)
    manifest = read_json(data_dir / MANIFEST)
    actual = split_files_hash(data_dir)
    if manifest.get("hash") != actual:
        raise ValueError(f"{data_dir}: split files do not match manifest hash ({actual} != {manifest.get('hash')})")
    return manifest
