"""Evaluation: how good a model is, where its loss comes from, and whether a new one got worse.

    model_dir + {val,test}.bin   -> fixed windows -> loss, perplexity, bits/byte, accuracy (metrics.py)
    model_dir + {val,test}.jsonl -> per-document scores (scoring.py)
        -> total / per source / per length bucket, adding up exactly (slices.py)
        -> worst cases, source blame, train<->held-out leakage via the data layer's MinHash
           (attribution.py, neardup.py) -> eval.json (offline.py)
    prompts -> greedy + sampled continuations -> distinct-n, repetition rate (generation.py)
    cases.jsonl -> NEW vs BASELINE, better/worse table, exit status (regression.py, gate.py)
    eval.json + regression.json + train_log.jsonl -> report.md + report.html (report.py, plots.py)
    labels -> accuracy, per-class precision/recall/F1, confusion matrix (classify.py; any classifier)
"""
from tinystack.eval.classify import classification_report, confusion_matrix
from tinystack.eval.generation import complete, distinct_n, generation_checks, repetition_rate
from tinystack.eval.metrics import evaluate_tokens, window_starts
from tinystack.eval.regression import Case, compare, load_cases, run_cases, write_cases
from tinystack.eval.scoring import DocScores, document_ids, score_documents, target_nats
from tinystack.eval.slices import length_bucket, split_report

__all__ = [
    "Case",
    "DocScores",
    "classification_report",
    "compare",
    "complete",
    "confusion_matrix",
    "distinct_n",
    "document_ids",
    "evaluate_tokens",
    "generation_checks",
    "length_bucket",
    "load_cases",
    "repetition_rate",
    "run_cases",
    "score_documents",
    "split_report",
    "target_nats",
    "window_starts",
    "write_cases",
]
