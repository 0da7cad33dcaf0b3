"""Record-level filters.

Normalisation and length (clean.py), quality rules (quality.py), the n-gram perplexity model (ngram_lm.py).
"""
