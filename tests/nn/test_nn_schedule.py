"""lr_at: warmup, peak, cosine decay, floor, edge cases."""
from __future__ import annotations

import ast
import inspect
import math

import pytest

from tinystack.nn import schedule
from tinystack.nn.schedule import lr_at

KW = dict(max_lr=3e-3, min_lr=3e-4, warmup_iters=50, max_iters=1500)


def test_shape_of_the_schedule() -> None:
    lrs = [lr_at(s, **KW) for s in range(1700)]
    W, M = KW["warmup_iters"], KW["max_iters"]
    assert 0 < lrs[0] <= KW["max_lr"] / W  # ~0 but not 0
    assert all(a < b for a, b in zip(lrs[:W], lrs[1 : W + 1]))  # strictly increasing warmup
    assert lrs[W] == KW["max_lr"] == max(lrs)  # peak exactly at warmup_iters
    assert all(a >= b for a, b in zip(lrs[W:], lrs[W + 1 :]))  # non-increasing afterwards
    assert lrs[M] == KW["min_lr"] and all(lr == KW["min_lr"] for lr in lrs[M:])
    assert math.isclose(lrs[(W + M) // 2 + 1], (KW["max_lr"] + KW["min_lr"]) / 2, rel_tol=1e-2)  # cosine midpoint
    assert abs(lrs[M - 1] - KW["min_lr"]) < 1e-8  # continuous into the floor


def test_edge_cases() -> None:
    assert lr_at(0, max_lr=1.0, min_lr=0.1, warmup_iters=0, max_iters=10) == 1.0  # no warmup
    # max_iters <= warmup_iters: warmup, then the floor
    assert lr_at(4, max_lr=1.0, min_lr=0.1, warmup_iters=5, max_iters=5) == pytest.approx(5 / 6)
    assert lr_at(5, max_lr=1.0, min_lr=0.1, warmup_iters=5, max_iters=5) == 0.1
    assert lr_at(3, max_lr=1.0, min_lr=1.0, warmup_iters=0, max_iters=10) == 1.0  # constant
    for bad in [dict(step=-1), dict(min_lr=2.0), dict(min_lr=-1.0), dict(warmup_iters=-1), dict(max_iters=-1)]:
        kw = {"step": 0, "max_lr": 1.0, "min_lr": 0.1, "warmup_iters": 2, "max_iters": 10, **bad}
        with pytest.raises(ValueError):
            lr_at(**kw)  # type: ignore[arg-type]


def test_schedule_is_pure_python() -> None:
    tree = ast.parse(inspect.getsource(schedule))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"math", "__future__"}, imported
    assert type(lr_at(10, **KW)) is float
