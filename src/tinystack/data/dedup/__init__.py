"""Deduplication: exact (exact.py) and near.

Near deduplication runs shingles -> minhash -> lsh -> near_duplicates -> unionfind; near_step.py is the
pipeline step, index.py the reusable NearDupIndex, ray_engine.py the Ray Data version.
"""
