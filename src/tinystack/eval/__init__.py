"""Evaluation: how good a model is, where its loss comes from, and whether a new one got worse.

    model_dir + {val,test}.bin   -> fixed windows -> loss, perplexity, bits/byte, accuracy (scoring.py: the
                                    one scoring function, which training's validation calls too)
    model_dir + {val,test}.jsonl -> per-document scores (scoring.py)
        -> total / per source / per length bucket, adding up exactly (slices.py)
        -> worst cases, source blame, train<->held-out leakage via the data layer's MinHash
           (attribution.py, neardup.py) -> eval.json (offline.py)
    prompts -> greedy + sampled continuations -> distinct-n, repetition rate (generation.py)
    held-out documents / conversations, prompts -> cases.jsonl (case_sets.py; chat cases in the model's template)
    cases.jsonl -> NEW vs BASELINE, better/worse table, exit status (regression.py, gate.py)
    new model_dir -> the promotion gate against the name's current model -> the registry (promotion.py,
        registry.py; `tinystack models list | show | promote | rollback`)
    eval.json + regression.json + train_log.jsonl -> report.md + report.html (report.py, plots.py)
    labels -> accuracy, per-class precision/recall/F1, confusion matrix (classify.py; any classifier)
"""
from tinystack.lazy import lazy_exports

_EXPORTS = {
    "classification_report": "tinystack.eval.classify",
    "confusion_matrix": "tinystack.eval.classify",
    "complete": "tinystack.eval.generation",
    "distinct_n": "tinystack.eval.generation",
    "generation_checks": "tinystack.eval.generation",
    "repetition_rate": "tinystack.eval.generation",
    "Case": "tinystack.eval.regression",
    "compare": "tinystack.eval.regression",
    "load_cases": "tinystack.eval.regression",
    "run_cases": "tinystack.eval.regression",
    "write_cases": "tinystack.eval.regression",
    "DocScores": "tinystack.eval.scoring",
    "Score": "tinystack.eval.scoring",
    "score_batches": "tinystack.eval.scoring",
    "score_tokens": "tinystack.eval.scoring",
    "token_nll": "tinystack.eval.scoring",
    "window_batches": "tinystack.eval.scoring",
    "window_starts": "tinystack.eval.scoring",
    "document_ids": "tinystack.eval.scoring",
    "score_documents": "tinystack.eval.scoring",
    "target_nats": "tinystack.eval.scoring",
    "length_bucket": "tinystack.eval.slices",
    "split_report": "tinystack.eval.slices",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "Case",
    "DocScores",
    "Score",
    "classification_report",
    "compare",
    "complete",
    "confusion_matrix",
    "distinct_n",
    "document_ids",
    "generation_checks",
    "length_bucket",
    "load_cases",
    "repetition_rate",
    "run_cases",
    "score_batches",
    "score_documents",
    "score_tokens",
    "split_report",
    "target_nats",
    "token_nll",
    "window_batches",
    "window_starts",
    "write_cases",
]
