"""InferenceRunner on its own: slots are never leaked (timeouts, cancellation, errors); timing is marked."""
import asyncio
import threading
import time

import pytest

from tinystack.infer import Generation, SamplingParams
from tinystack.observe import TIMING_POINTS, RequestTiming
from tinystack.serve import InferenceRunner, InferenceTimeout


def fake_generate(delay_s: float, fail: bool = False):
    """A generate() that sleeps delay_s per token, checking cancel, optionally raising at the end."""
    stopped: list[str] = []

    def generate(prompt: str, params: SamplingParams, cancel: threading.Event | None = None) -> Generation:
        out = []
        finish = "length"
        for _ in range(params.max_tokens):
            if cancel is not None and cancel.is_set():
                finish = "cancelled"
                break
            time.sleep(delay_s)
            out.append(1)
        stopped.append(finish)
        if fail:
            raise RuntimeError("boom")
        return Generation("x" * len(out), out, 1, finish, prefill_s=0.001, decode_s=delay_s * len(out))

    generate.stopped = stopped  # type: ignore[attr-defined]
    return generate


async def _all_slots_free(runner: InferenceRunner, timeout: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout
    while runner.in_flight and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return runner.in_flight == 0 and runner.waiting == 0


def test_success_marks_points_in_order_and_engine_split():
    async def main():
        runner = InferenceRunner(fake_generate(0.001), max_concurrency=2, timeout_s=5)
        timing = RequestTiming()
        timing.mark("arrival")
        gen = await runner.run("p", SamplingParams(max_tokens=3), timing)
        timing.mark("returned")
        runner.close()
        return gen, timing

    gen, timing = asyncio.run(main())
    assert gen.finish_reason == "length" and len(gen.token_ids) == 3
    assert list(timing.points) == list(TIMING_POINTS)
    assert timing.to_dict()["prefill_ms"] == 1.0 and timing.inference_ms >= 3 * 1.0 - 0.5


def test_many_timeouts_and_cancellations_leak_no_slot():
    generate = fake_generate(0.02)

    async def main():
        runner = InferenceRunner(generate, max_concurrency=2, timeout_s=0.15)

        async def one(max_tokens):
            timing = RequestTiming()
            timing.mark("arrival")
            try:
                await runner.run("p", SamplingParams(max_tokens=max_tokens), timing)
                return "ok"
            except InferenceTimeout as e:
                return e.stage

        tasks = [asyncio.create_task(one(n)) for n in (2, 50, 50, 2, 50, 2, 50, 50)]
        await asyncio.sleep(0.05)
        tasks[-1].cancel()  # a client that went away while queued
        results = await asyncio.gather(*tasks, return_exceptions=True)
        free = await _all_slots_free(runner)
        # every slot can be taken again, at once
        again = await asyncio.gather(*(one(1) for _ in range(2)))
        runner.close()
        return results, free, again

    results, free, again = asyncio.run(main())
    assert free
    assert again == ["ok", "ok"]
    assert "inference" in results and "ok" in results
    assert isinstance(results[-1], asyncio.CancelledError)
    assert "length" in generate.stopped and "cancelled" in generate.stopped


def test_engine_errors_propagate_and_free_the_slot():
    async def main():
        runner = InferenceRunner(fake_generate(0.0, fail=True), max_concurrency=1, timeout_s=5)
        timing = RequestTiming()
        with pytest.raises(RuntimeError, match="boom"):
            await runner.run("p", SamplingParams(max_tokens=1), timing)
        free = await _all_slots_free(runner)
        runner.close()
        return free, timing

    free, timing = asyncio.run(main())
    assert free and timing.is_marked("end")


def test_invalid_settings_are_rejected():
    with pytest.raises(ValueError, match="max_concurrency"):
        InferenceRunner(fake_generate(0.0), max_concurrency=0, timeout_s=1)
    with pytest.raises(ValueError, match="timeout_s"):
        InferenceRunner(fake_generate(0.0), max_concurrency=1, timeout_s=0)
