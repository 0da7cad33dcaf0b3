"""The data layer: raw text -> validated records -> clean, filtered, deduplicated,
leak-free train/val/test JSONL.

Data flows through small composable steps, datatrove style, each counting what it
kept and what it dropped (and why). Files are grouped by role:

    inputs (.jsonl / .csv / .tsv / .parquet / .txt / folder of .txt, or the built-in corpus)
      -> read        io/readers.py, io/formats.py   Records (io/records.py); bad input ->
                                                    rejected.jsonl (io/rejects.py)
      -> normalize   filters/clean.py     NFC, \\n line endings, no trailing spaces, <= 1 blank line
      -> length      filters/clean.py     too_short / too_long
      -> quality     filters/quality.py   words, charset, symbols/digits, repetition;
                     filters/ngram_lm.py  character n-gram (Kneser-Ney) perplexity filter
      -> dedup       dedup/exact.py       exact (SHA-256 of normalised text), first kept
      -> near dedup  dedup/near_step.py   MinHash (dedup/shingles.py, dedup/minhash.py) + LSH
                                          (dedup/lsh.py) + verification (dedup/near_duplicates.py)
                                          + union-find (dedup/unionfind.py); `cluster_id` on every
                                          record; dedup/ray_engine.py on Ray Data
      -> split       split/splitter.py    by source (SHA-256 order) or by time cutoffs; never random
      -> leakage     split/leakage.py     val/test near copies of train removed (NearDupIndex,
                                          dedup/index.py, built from the dedup signatures)
      -> out_dir/{train,val,test}.jsonl, rejected.jsonl, manifest.json (pipeline.py, io/manifest.py)

Records stream through generators; steps that must see everything first park them
in on-disk spools (io/spool.py), so memory holds the signature index, not the corpus.
`steps.py` is the step abstraction, `tools.py` holds the single-purpose commands
(normalize, filter, dedup, split), `commands.py` their CLI, `stage.py` the pipeline
stage, `options.py` the [data] config -> parameters mapping, `report.py` the summary table.

Every file is written through `tinystack.atomic`, so a crash never leaves a
truncated file; `manifest.json` is written last and its ``"hash"`` (over the three
split files) is the lineage id later stages record. Other layers ask "is a near
duplicate of this text in train?" with ``NearDupIndex.from_jsonl(path).contains(texts)``.
"""
from tinystack.data.filters.clean import LengthFilter, Normalize, normalize_text
from tinystack.data.io.corpus import build_corpus, iter_corpus
from tinystack.data.dedup.exact import ExactDedup, exact_key, text_sha256
from tinystack.data.filters.quality import (CharsetFilter, QualityParams, RepetitionFilter, SymbolFilter,
                                    WordCountFilter)
from tinystack.data.io.formats import FieldMap, read_csv, read_parquet, write_parquet, write_records
from tinystack.data.dedup.minhash import MinHasher, MinHashParams
from tinystack.data.dedup.near_step import NearDedup
from tinystack.data.dedup.near_duplicates import NearDupParams, find_pairs
from tinystack.data.dedup.index import Match, NearDupIndex
from tinystack.data.filters.ngram_lm import CharNgramLM, PerplexityFilter
from tinystack.data.io.manifest import split_files_hash, verify_data_dir
from tinystack.data.pipeline import prepare
from tinystack.data.io.readers import input_files, read_inputs, read_jsonl, read_text
from tinystack.data.io.records import Record, RecordError, parse_timestamp, write_jsonl
from tinystack.data.io.rejects import Rejects
from tinystack.data.split.splitter import SPLITS, Splitter, StreamSplitter, assign_sources, split_by_source, split_by_time
from tinystack.data.steps import Step, StepStats

__all__ = [
    "CharNgramLM",
    "CharsetFilter",
    "ExactDedup",
    "FieldMap",
    "Match",
    "MinHashParams",
    "MinHasher",
    "NearDedup",
    "NearDupIndex",
    "NearDupParams",
    "PerplexityFilter",
    "QualityParams",
    "RepetitionFilter",
    "StreamSplitter",
    "SymbolFilter",
    "WordCountFilter",
    "find_pairs",
    "read_csv",
    "read_parquet",
    "write_parquet",
    "write_records",
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
    "exact_key",
    "verify_data_dir",
    "write_jsonl",
]
