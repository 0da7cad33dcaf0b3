"""A client that drops a request while it is queued or generating, or a request that runs out of time:
the engine aborts the sequence every time (checked from the engine's own finish reasons, not from
timing), over many trials with a fast model, so that a disconnect or a deadline landing just as a
token arrives is exercised too (Python 3.11's asyncio.wait_for dropped such a cancellation)."""
import random
import socket

import httpx
import pytest
from serve_helpers import PROMPT, FaultyModel, tiny_gpt, wait_for

from tinystack.config import InferConfig
from tinystack.infer import AsyncEngine, LLMEngine

TRIALS = 120


def _raw_post(url: str, body: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return sock


@pytest.fixture
def one_slot_engine(tokenizer):
    """One sequence at a time (a second one waits in the engine's queue); a token every ~1 ms."""
    engine = AsyncEngine(LLMEngine(FaultyModel(tiny_gpt(tokenizer), delay_s=0.001), tokenizer,
                                   InferConfig(max_num_seqs=1, num_kv_blocks=64)))
    yield engine
    engine.shutdown()


def _ended(adapter) -> dict[str, int]:
    """The engine's sequences ended so far, by its finish reason."""
    return adapter.stats().ended


def _wait_ended(adapter, total: int) -> dict[str, int]:
    """Wait until `total` sequences have ended in the engine (their final outputs come shortly after
    an abort); return the counts by finish reason."""
    assert wait_for(lambda: sum(_ended(adapter).values()) >= total, 5), _ended(adapter)
    return _ended(adapter)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_dropped_request_is_aborted_in_the_engine_every_time(serve, one_slot_engine, stream):
    served = serve(one_slot_engine, timeout_s=30, max_num_seqs=1, max_queued_requests=4)
    adapter, counters = served.state.adapter, one_slot_engine.engine.counters
    rng = random.Random(0)
    body = b'{"prompt": "%s", "max_tokens": 50, "ignore_eos": true, "stream": %s}' % (
        PROMPT.encode(), b"true" if stream else b"false")
    for trial in range(TRIALS):
        before = _ended(adapter)
        socks = [_raw_post(served.url, body), _raw_post(served.url, body)]
        # one generating, one queued in the engine behind it
        assert wait_for(lambda: adapter.stats().running == 1 and adapter.stats().waiting == 1, 5), trial
        until = counters.steps + rng.randint(0, 8)  # drop them 0-8 tokens in: in any phase of a step
        assert wait_for(lambda: counters.steps >= until, 5)  # noqa: B023 (waited for at once)
        rng.shuffle(socks)
        for sock in socks:
            sock.close()
        after = _wait_ended(adapter, sum(before.values()) + 2)
        # neither ran to the end: the engine aborted both, the queued one and the generating one
        assert after.get("abort", 0) - before.get("abort", 0) == 2, (trial, before, after)
        assert wait_for(lambda: served.state.gate.in_flight == 0 and adapter.stats().kv_bytes_in_use == 0, 5)
    assert served.state.counters["aborted"] == 2 * TRIALS


def test_a_request_out_of_time_is_aborted_in_the_engine_every_time(serve, one_slot_engine):
    one_slot_engine.engine.model.delay_s = 0.002  # 50 tokens take >= 100 ms; the deadlines are 10-40 ms
    served = serve(one_slot_engine, timeout_s=30, max_num_seqs=1)
    adapter = served.state.adapter
    rng = random.Random(1)
    with httpx.Client(base_url=served.url, timeout=10) as client:
        for trial in range(TRIALS // 2):
            before = _ended(adapter)
            r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 50, "ignore_eos": True,
                                                     "timeout": rng.uniform(0.01, 0.04)})
            assert r.status_code == 504, (trial, r.text)  # a deadline, not mistaken for a stall
            after = _wait_ended(adapter, sum(before.values()) + 1)
            assert after.get("abort", 0) - before.get("abort", 0) == 1, (trial, before, after)
    assert served.state.counters["timeouts"] == TRIALS // 2
