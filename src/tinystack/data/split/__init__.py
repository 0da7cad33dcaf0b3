"""Splitting without leaks: by source or time (splitter.py), then near copies across splits removed (leakage.py)."""
