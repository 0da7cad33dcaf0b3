"""RequestTiming: points only in order and once each; derived durations add up, also after rounding."""
import random

import pytest

from tinystack.observe import TIMING_POINTS, RequestTiming, TimingError


class FakeClock:
    def __init__(self, times):
        self.times = list(times)

    def __call__(self):
        return self.times.pop(0)


def timed(*seconds):
    t = RequestTiming(clock=FakeClock(seconds))
    for point in TIMING_POINTS[:len(seconds)]:
        t.mark(point)
    return t


def test_derived_values_from_the_five_points():
    t = timed(10.0, 10.001, 10.0035, 10.2535, 10.26)
    assert t.queue_ms == 2.5
    assert t.inference_ms == 250.0
    assert t.total_ms == 260.0
    assert t.to_dict() == {"queue_ms": 2.5, "inference_ms": 250.0, "total_ms": 260.0}


def test_to_dict_rounds_and_adds_engine_split_when_given():
    t = timed(0.0, 0.0000123, 0.0001234, 0.0101234, 0.0111111)
    t.prefill_ms, t.decode_ms = 1.23456, 8.76543
    d = t.to_dict()
    assert set(d) == {"queue_ms", "inference_ms", "total_ms", "prefill_ms", "decode_ms"}
    assert all(v == round(v, 2) for v in d.values())
    assert d["prefill_ms"] == 1.23 and d["decode_ms"] == 8.77


def test_queue_plus_inference_never_exceeds_total_even_after_rounding():
    rng = random.Random(0)
    for _ in range(2000):
        gaps = [rng.choice([0.0, 1e-7, 4e-6, 5e-6, 6e-6, rng.random() * 1e-3]) for _ in range(4)]
        pts = [100.0]
        for g in gaps:
            pts.append(pts[-1] + g)
        t = timed(*pts)
        assert t.queue_ms >= 0 and t.inference_ms >= 0
        assert t.queue_ms + t.inference_ms <= t.total_ms + 1e-9


def test_missing_points_give_none():
    t = timed(1.0, 1.5)
    assert t.queue_ms is None and t.inference_ms is None and t.total_ms is None


def test_marking_twice_raises():
    t = RequestTiming()
    t.mark("arrival")
    with pytest.raises(TimingError, match="already"):
        t.mark("arrival")


def test_marking_out_of_order_raises():
    t = RequestTiming()
    t.mark("arrival")
    t.mark("start")
    with pytest.raises(TimingError, match="after later point"):
        t.mark("enqueue")


def test_a_time_earlier_than_the_previous_point_raises():
    t = RequestTiming(clock=FakeClock([5.0]))
    t.mark("arrival")
    with pytest.raises(TimingError, match="earlier"):
        t.mark("enqueue", at=4.0)


def test_unknown_point_raises_value_error():
    with pytest.raises(ValueError, match="unknown timing point"):
        RequestTiming().mark("finished")


def test_points_may_be_skipped_but_stay_ordered():
    t = timed(1.0)
    t.mark("returned", at=1.25)  # e.g. rejected before it was queued
    assert t.total_ms == 250.0 and t.queue_ms is None
    assert list(t.points) == ["arrival", "returned"]


def test_real_clock_marks_are_monotonic():
    t = RequestTiming()
    stamps = [t.mark(p) for p in TIMING_POINTS]
    assert stamps == sorted(stamps)
    assert all(t.is_marked(p) for p in TIMING_POINTS)
    assert t.total_ms >= t.queue_ms + t.inference_ms
