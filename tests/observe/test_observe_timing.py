"""RequestTiming: points only in order and once each; derived durations add up, also after rounding."""
import random

import pytest

from tinystack.observe import TIMING_POINTS, RequestTiming, TimingError
from tinystack.observe.timing import SEGMENTS, SPANS


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


def test_the_seven_points_in_order():
    assert TIMING_POINTS == ("arrival", "validated", "enqueued", "scheduled", "first_token", "last_token", "returned")


def test_derived_values_from_the_seven_points():
    #       arrival validated enqueued scheduled first_tok last_tok returned
    t = timed(10.0, 10.0005, 10.001, 10.0035, 10.0535, 10.2535, 10.26)
    t.output_tokens = 5
    assert t.validate_ms == 1.0
    assert t.queue_ms == 2.5
    assert t.prefill_ms == 50.0
    assert t.decode_ms == 200.0
    assert t.respond_ms == 6.5
    assert t.inference_ms == 250.0
    assert t.ttft_ms == 53.5
    assert t.tpot_ms == 50.0  # 200 ms over the 4 tokens after the first
    assert t.total_ms == 260.0
    assert t.to_dict() == {"validate_ms": 1.0, "queue_ms": 2.5, "prefill_ms": 50.0, "decode_ms": 200.0,
                           "respond_ms": 6.5, "inference_ms": 250.0, "ttft_ms": 53.5, "total_ms": 260.0,
                           "tpot_ms": 50.0}
    assert t.seconds("queue_ms") == 0.0025 and t.seconds("tpot_ms") == 0.05


def test_tpot_needs_two_tokens():
    t = timed(*[float(i) for i in range(7)])
    assert t.tpot_ms is None
    t.output_tokens = 1
    assert t.tpot_ms is None


def test_segments_sum_exactly_to_the_total_even_after_rounding():
    rng = random.Random(0)
    for _ in range(2000):
        gaps = [rng.choice([0.0, 1e-7, 4e-6, 5e-6, 6e-6, rng.random() * 1e-3]) for _ in range(6)]
        pts = [100.0]
        for g in gaps:
            pts.append(pts[-1] + g)
        t = timed(*pts)
        d = t.to_dict()
        assert all(d[name] >= 0 for name in SPANS)
        assert round(sum(d[s] for s in SEGMENTS), 2) == d["total_ms"]
        assert round(d["prefill_ms"] + d["decode_ms"], 2) == d["inference_ms"]
        assert d["ttft_ms"] <= d["total_ms"]


def test_missing_points_give_none():
    t = timed(1.0, 1.5)
    assert t.queue_ms is None and t.inference_ms is None and t.total_ms is None and t.ttft_ms is None


def test_marking_twice_raises():
    t = RequestTiming()
    t.mark("arrival")
    with pytest.raises(TimingError, match="already"):
        t.mark("arrival")


def test_marking_out_of_order_raises():
    t = RequestTiming()
    t.mark("arrival")
    t.mark("scheduled")
    with pytest.raises(TimingError, match="after later point"):
        t.mark("enqueued")


def test_a_time_earlier_than_the_previous_point_raises():
    t = RequestTiming(clock=FakeClock([5.0]))
    t.mark("arrival")
    with pytest.raises(TimingError, match="earlier"):
        t.mark("enqueued", at=4.0)


def test_mark_clamped_moves_an_early_stamp_up_to_the_latest_point():
    t = RequestTiming(clock=FakeClock([5.0]))
    t.mark("arrival")
    assert t.mark_clamped("scheduled", at=4.0) == 5.0  # another thread's reading, a hair early
    assert t.mark_clamped("first_token", at=6.0) == 6.0
    with pytest.raises(TimingError, match="after later point"):
        t.mark_clamped("enqueued", at=7.0)  # the order itself is still enforced


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
