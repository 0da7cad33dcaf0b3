"""RequestLog: one valid JSON line per call, written on a background thread, never slowing the caller."""
import json
import threading
import time
from datetime import datetime

import pytest

from tinystack.observe import setup_request_log


class RecordingStream:
    """A text stream that remembers what was written and on which thread; optionally slow."""

    def __init__(self, delay_s: float = 0.0):
        self.delay_s = delay_s
        self.parts: list[str] = []
        self.threads: set[str] = set()

    def write(self, s: str) -> int:
        if self.delay_s:
            time.sleep(self.delay_s)
        self.threads.add(threading.current_thread().name)
        self.parts.append(s)
        return len(s)

    def flush(self) -> None:
        pass

    def lines(self) -> list[str]:
        return "".join(self.parts).splitlines()


def test_one_json_object_per_call_with_standard_fields(tmp_path):
    path = tmp_path / "logs" / "requests.jsonl"  # parent is created
    log = setup_request_log(path)
    log.log("request", request_id="r1", status=200, total_ms=12.5)
    log.log("request", request_id="r2", status=504, error_code="timeout")
    log.log("startup")
    log.close()
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3
    rows = [json.loads(line) for line in lines]
    assert [r["request_id"] for r in rows] == ["r1", "r2", None]
    assert [r["status"] for r in rows] == [200, 504, None]
    assert rows[0]["event"] == "request" and rows[0]["total_ms"] == 12.5
    assert rows[1]["error_code"] == "timeout"
    assert list(rows[0])[:4] == ["ts", "event", "request_id", "status"]
    ts = datetime.fromisoformat(rows[0]["ts"].replace("Z", "+00:00"))
    assert ts.utcoffset().total_seconds() == 0


def test_appends_to_an_existing_file(tmp_path):
    path = tmp_path / "requests.jsonl"
    for rid in ("a", "b"):
        with setup_request_log(path) as log:
            log.log("request", request_id=rid, status=200)
    assert [json.loads(x)["request_id"] for x in path.read_text().splitlines()] == ["a", "b"]


def test_lines_are_written_by_the_background_thread():
    stream = RecordingStream()
    log = setup_request_log(None, stream=stream)
    for i in range(5):
        log.log("request", request_id=str(i), status=200)
    log.close()
    assert len(stream.lines()) == 5
    assert threading.current_thread().name not in stream.threads
    assert stream.threads  # someone wrote: the listener thread


def test_a_slow_sink_does_not_slow_down_log_calls():
    stream = RecordingStream(delay_s=0.2)  # 100 records would take 20 s to write
    log = setup_request_log(None, stream=stream)
    t0 = time.perf_counter()
    for i in range(100):
        log.log("request", request_id=str(i), status=200, total_ms=float(i))
    elapsed = time.perf_counter() - t0
    assert elapsed < 0.5, f"100 log() calls took {elapsed:.2f} s"
    stream.delay_s = 0.0  # let close() drain quickly
    log.close()
    ids = [json.loads(line)["request_id"] for line in stream.lines()]
    assert ids == [str(i) for i in range(100)]  # nothing lost, order kept


def test_prompt_and_output_text_are_not_logged_by_default():
    stream = RecordingStream()
    log = setup_request_log(None, stream=stream)
    log.log("request", request_id="r", status=200, prompt="SECRET PROMPT", text="SECRET OUTPUT", prompt_tokens=3)
    log.close()
    (row,) = [json.loads(x) for x in stream.lines()]
    assert "prompt" not in row and "text" not in row and row["prompt_tokens"] == 3
    assert "SECRET" not in "".join(stream.parts)


def test_text_is_logged_when_asked_for():
    stream = RecordingStream()
    log = setup_request_log(None, stream=stream, include_text=True)
    log.log("request", request_id="r", status=200, prompt="hello", text="world")
    log.close()
    (row,) = [json.loads(x) for x in stream.lines()]
    assert row["prompt"] == "hello" and row["text"] == "world"


def test_unserialisable_values_are_stringified_and_close_is_idempotent():
    stream = RecordingStream()
    log = setup_request_log(None, stream=stream)
    log.log("request", request_id="r", status=200, where=object(), ratio=float("inf"))
    log.close()
    log.close()
    log.log("request", request_id="after-close")  # a no-op, not an error
    lines = stream.lines()
    assert len(lines) == 1
    row = json.loads(lines[0], parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert row["where"].startswith("<object") and row["ratio"] == "inf"


def test_no_sink_discards_quietly():
    log = setup_request_log(None)
    log.log("request", request_id="r", status=200)
    log.close()
    assert log.closed


def test_line_separator_characters_in_text_keep_one_record_per_line():
    """U+0085 / U+2028 / U+2029 are line breaks to str.splitlines() (and to many JSONL readers) that JSON leaves
    raw: they are written as escapes, and read back as the same text."""
    stream = RecordingStream()
    log = setup_request_log(None, stream=stream, include_text=True)
    text = "a\u2028b\x85c\u2029d é"
    log.log("request", request_id="r1", status=200, text=text)
    log.log("request", request_id="r2", status=200, text="plain")
    log.close()
    rows = [json.loads(x) for x in stream.lines()]
    assert [r["request_id"] for r in rows] == ["r1", "r2"] and rows[0]["text"] == text
