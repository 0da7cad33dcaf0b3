"""The data layer: raw text -> validated records -> clean, filtered, deduplicated,
leak-free train/val/test JSONL.

Data flows through small composable steps, datatrove style, each counting what it
kept and what it dropped (and why):

    inputs (.jsonl / .csv / .tsv / .parquet / .txt / folder of .txt, or the built-in corpus)
      -> read        readers.py, formats.py   Records (field mapping); bad input -> rejected.jsonl
      -> normalize   clean.py      NFC, \\n line endings, no trailing spaces, <= 1 blank line
      -> length      clean.py      too_short / too_long
      -> quality     filters.py    words, charset, symbols/digits, repetition;
                     ngram_lm.py   character n-gram (Kneser-Ney) perplexity filter
      -> dedup       dedup.py      exact (SHA-256 of normalised text), first kept
      -> near dedup  near_dedup.py MinHash (shingles.py, minhash.py) + LSH (lsh.py) +
                                   verification (neardup.py) + union-find (unionfind.py);
                                   `cluster_id` on every record; ray_engine.py on Ray Data
      -> split       split.py      by source (SHA-256 order) or by time cutoffs; never random
      -> leakage     leakage.py    val/test near copies of train removed (NearDupIndex,
                                   neardup_index.py, built from the dedup signatures)
      -> out_dir/{train,val,test}.jsonl, rejected.jsonl, manifest.json (pipeline.py)

Records stream through generators; steps that must see everything first park them
in on-disk spools (spool.py), so memory holds the signature index, not the corpus.
`tools.py` holds the single-purpose commands (normalize, filter, dedup, split),
`commands.py` their CLI, `options.py` the [data] config -> parameters mapping,
`report.py` the summary table, `progress.py` the progress bar.

Every file is written through `tinystack.atomic`, so a crash never leaves a
truncated file; `manifest.json` is written last and its ``"hash"`` (over the three
split files) is the lineage id later stages record. Other layers ask "is a near
duplicate of this text in train?" with ``NearDupIndex.from_jsonl(path).contains(texts)``.
"""
from tinystack.data.clean import LengthFilter, Normalize, normalize_text
from tinystack.data.corpus import build_corpus, iter_corpus
from tinystack.data.dedup import ExactDedup, exact_key, text_sha256
from tinystack.data.filters import (CharsetFilter, QualityParams, RepetitionFilter, SymbolFilter,
                                    WordCountFilter)
from tinystack.data.formats import FieldMap, read_csv, read_parquet, write_parquet, write_records
from tinystack.data.minhash import MinHasher, MinHashParams
from tinystack.data.near_dedup import NearDedup
from tinystack.data.neardup import NearDupParams, find_pairs
from tinystack.data.neardup_index import Match, NearDupIndex
from tinystack.data.ngram_lm import CharNgramLM, PerplexityFilter
from tinystack.data.manifest import split_files_hash, verify_data_dir
from tinystack.data.pipeline import prepare
from tinystack.data.readers import input_files, read_inputs, read_jsonl, read_text
from tinystack.data.records import Record, RecordError, parse_timestamp, write_jsonl
from tinystack.data.rejects import Rejects
from tinystack.data.split import SPLITS, Splitter, StreamSplitter, assign_sources, split_by_source, split_by_time
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
