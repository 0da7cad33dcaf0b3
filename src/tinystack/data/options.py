"""`DataConfig` (the ``[data]`` config section) -> the data layer's typed parameters.

One place turns the flat config keys into `FieldMap`, `QualityParams` and
`NearDupParams`, so `prepare` (which takes the section whole) and the single-step data
commands interpret a config identically.
"""
from __future__ import annotations

from typing import Any

from tinystack.data.dedup.near_duplicates import NearDupParams
from tinystack.data.filters.quality import QualityParams
from tinystack.data.io.formats import FieldMap


def field_map(d: Any) -> FieldMap:
    return FieldMap(text=d.text_field, source=d.source_field, label=d.label_field,
                    timestamp=d.timestamp_field, id=d.id_field)


def quality_params(d: Any) -> QualityParams | None:
    if not d.quality:
        return None
    return QualityParams(min_words=d.min_words, max_words=d.max_words, scripts=tuple(d.scripts),
                         min_script_ratio=d.min_script_ratio, max_symbol_ratio=d.max_symbol_ratio,
                         max_digit_ratio=d.max_digit_ratio, repetition=d.repetition,
                         perplexity_reference=tuple(d.perplexity_reference),
                         perplexity_percentile=d.perplexity_percentile, perplexity_order=d.perplexity_order,
                         perplexity_max_chars=d.perplexity_max_chars)


def near_dup_params(d: Any, threshold: float | None = None) -> NearDupParams:
    return NearDupParams(threshold=d.dedup_threshold if threshold is None else threshold, num_perm=d.num_perm,
                         k=d.shingle_k, unit=d.shingle_unit)
