"""Jitter sources as numbers: GC pauses (gc.callbacks), gc.freeze at start-up, and event-loop lag."""
import gc
import time

from obs_helpers import scrape, total, value
from serve_helpers import wait_for


def test_gc_pauses_are_measured_and_the_model_is_frozen(serve, async_engine):
    frozen_before = gc.get_freeze_count()
    s = serve(async_engine, gc_freeze=True)
    assert gc.get_freeze_count() > frozen_before  # what was alive at start-up left the collector's view
    before = total(scrape(s.url), "tinystack_gc_pause_seconds_count")
    for _ in range(3):
        gc.collect()  # the callbacks are process-wide: any thread's collection is timed
    m = scrape(s.url)
    assert total(m, "tinystack_gc_pause_seconds_count") >= before + 3
    assert value(m, "tinystack_gc_pause_seconds_count", generation=2) >= 3
    assert total(m, "tinystack_gc_pause_seconds_sum") > 0


def test_gc_freeze_can_be_turned_off(serve, async_engine):
    frozen_before = gc.get_freeze_count()
    serve(async_engine, gc_freeze=False)
    assert gc.get_freeze_count() == frozen_before


def test_a_blocked_event_loop_shows_up_as_lag(serve, async_engine):
    s = serve(async_engine, loop_lag_interval_s=0.02)
    loop = s.app.state.observer.loop

    def slow_samples():  # lag observations above 0.25 s (count minus the le=0.25 bucket)
        m = scrape(s.url)
        return value(m, "tinystack_event_loop_lag_seconds_count") - \
            value(m, "tinystack_event_loop_lag_seconds_bucket", le=0.25)
    assert wait_for(lambda: value(scrape(s.url), "tinystack_event_loop_lag_seconds_count") >= 5, 5)
    base = slow_samples()  # 0 on a quiet machine
    loop.call_soon_threadsafe(time.sleep, 0.4)  # a blocking call on the server's loop
    assert wait_for(lambda: slow_samples() >= base + 1, 5)
    assert value(scrape(s.url), "tinystack_event_loop_lag_seconds_sum") >= 0.3
