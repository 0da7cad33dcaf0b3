"""The small pieces on their own: stop strings in streamed text, the circuit breaker, the gate, chat format."""
import pytest

from tinystack.infer.chat import ChatFormatter, ChatTemplateError
from tinystack.serve.engine.detok import IncrementalText
from tinystack.serve.guards.protect import AdmissionGate, CircuitBreaker


def _chars(text: str):
    """A 'tokenizer' whose tokens are single characters (ids = code points)."""
    return [ord(c) for c in text], lambda ids: "".join(chr(i) for i in ids)


@pytest.mark.parametrize("text,stops,expected", [
    ("hello world. more", ["."], "hello world"),
    ("hello world. more", ["wor", "."], "hello "),
    ("abcabc", ["ca"], "ab"),
    ("no stop here", ["zzz"], "no stop here"),
    ("no stops at all", [], "no stops at all"),
])
def test_streamed_text_never_contains_the_stop_string(text, stops, expected):
    ids, decode = _chars(text)
    inc = IncrementalText(decode, stops)
    out = ""
    for i in ids:
        out += inc.push(i)
        for s in stops:  # nothing of the stop string is ever sent
            assert s not in out
    out += inc.flush()
    assert out == expected and inc.text == expected
    assert inc.stopped == (expected != text)


def test_cut_multibyte_characters_are_held_back():
    data = "é€".encode()
    ids = list(data)
    inc = IncrementalText(lambda ts: bytes(ts).decode("utf-8", errors="replace"))
    pieces = [inc.push(i) for i in ids]
    assert "".join(pieces) + inc.flush() == "é€" and "\ufffd" not in "".join(pieces)


def test_breaker_opens_half_opens_and_closes():
    now = [0.0]
    b = CircuitBreaker(failure_threshold=3, cooldown_s=10, clock=lambda: now[0])
    for _ in range(2):
        assert b.allow()
        b.record_failure()
    b.record_success()  # consecutive failures only
    for _ in range(3):
        assert b.allow()
        b.record_failure()
    assert b.state == "open" and not b.allow() and b.retry_after_s() == 10
    now[0] = 10.0
    assert b.state == "half_open" and b.allow() and not b.allow()  # one probe at a time
    b.record_failure()  # the probe failed: open again for a full cool-down
    assert b.state == "open" and b.times_opened == 2
    now[0] = 20.0
    assert b.allow()
    b.record_success()
    assert b.state == "closed" and b.allow() and b.allow()


def test_gate_bounds_in_flight():
    g = AdmissionGate(max_num_seqs=2, max_queued_requests=1)
    assert g.try_enter(2) and not g.try_enter(2) and g.try_enter(1) and not g.try_enter(1)
    g.leave(2)
    assert g.try_enter(2) and g.in_flight == 3


def test_builtin_chat_format_and_template_errors():
    assert ChatFormatter(None).render([{"role": "user", "content": "hi"}]) == "user: hi\nassistant:"
    strict = ChatFormatter("{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}x")
    with pytest.raises(ChatTemplateError, match="user first"):
        strict.render([{"role": "system", "content": "s"}])
    with pytest.raises(ChatTemplateError):  # the sandbox refuses attribute access tricks
        ChatFormatter("{{ messages.__class__.__mro__ }}").render([{"role": "user", "content": "x"}])
