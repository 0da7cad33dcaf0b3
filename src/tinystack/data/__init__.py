"""The data layer: raw text -> validated records -> clean, deduplicated, split JSONL.

Data flows through small composable steps, datatrove style, each counting what it
kept and what it dropped (and why):

    inputs (.jsonl / .txt / folder of .txt, or the built-in stdlib-docstring corpus)
      -> read        readers.py   bytes -> `Record`s; bad lines -> rejected.jsonl (file, line, reason)
      -> normalize   clean.py     NFC, \\n line endings, no trailing spaces, <= 1 blank line
      -> length      clean.py     drop too_short / too_long
      -> dedup       dedup.py     drop exact duplicates (SHA-256 of normalised text), first kept
      -> split       split.py     by source (SHA-256 order) or by time cutoffs; never random
      -> out_dir/{train,val,test}.jsonl, rejected.jsonl, manifest.json (pipeline.py)

Files: `records` (schema, `write_jsonl`), `rejects` (reject sink), `readers`,
`steps` (`Step`/`StepStats`), `clean`, `dedup`, `split`, `corpus` (built-in corpus),
`manifest` (hashes, lineage check), `pipeline` (`prepare`).

Every file is written through `tinystack.atomic`, so a crash never leaves a
truncated file; `manifest.json` is written last and its ``"hash"`` (over the three
split files) is the lineage id later stages record.
"""
from tinystack.data.clean import LengthFilter, Normalize, normalize_text
from tinystack.data.corpus import build_corpus, iter_corpus
from tinystack.data.dedup import ExactDedup, text_sha256
from tinystack.data.manifest import split_files_hash, verify_data_dir
from tinystack.data.pipeline import prepare
from tinystack.data.readers import input_files, read_inputs, read_jsonl, read_text
from tinystack.data.records import Record, RecordError, parse_timestamp, write_jsonl
from tinystack.data.rejects import Rejects
from tinystack.data.split import SPLITS, Splitter, assign_sources, split_by_source, split_by_time
from tinystack.data.steps import Step, StepStats

__all__ = [
    "ExactDedup",
    "LengthFilter",
    "Normalize",
    "Record",
    "RecordError",
    "Rejects",
    "SPLITS",
    "Splitter",
    "Step",
    "StepStats",
    "assign_sources",
    "build_corpus",
    "input_files",
    "iter_corpus",
    "normalize_text",
    "parse_timestamp",
    "prepare",
    "read_inputs",
    "read_jsonl",
    "read_text",
    "split_by_source",
    "split_by_time",
    "split_files_hash",
    "text_sha256",
    "verify_data_dir",
    "write_jsonl",
]
