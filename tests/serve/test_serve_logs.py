"""One JSON log line per request, with the request id and timing, and no prompt or output text."""
import json
import re

import httpx

from tinystack.config import ServeConfig
from tinystack.observe import setup_request_log
from tinystack.serve import create_app, run_in_background

SECRET = "zebra quantum marmalade"


def run_requests(engine, log_path, include_text=False):
    log = setup_request_log(log_path, include_text=include_text)
    try:
        with run_in_background(create_app(engine, ServeConfig(), log), shutdown_timeout_s=5) as url:
            with httpx.Client(base_url=url, timeout=10) as c:
                ok = c.post("/generate", json={"prompt": SECRET, "max_tokens": 4, "temperature": 0},
                            headers={"x-request-id": "req-one"})
                fresh = c.post("/generate", json={"prompt": SECRET, "max_tokens": 3, "seed": 1})
                bad = c.post("/generate", json={"prompt": SECRET, "top_p": 2})
                health = c.get("/health")
    finally:
        log.close()
    rows = [json.loads(line) for line in log_path.read_text(encoding="utf-8").splitlines()]
    return rows, (ok, fresh, bad, health)


def test_one_line_per_request_with_id_status_counts_and_timing(engine, tmp_path):
    rows, (ok, fresh, bad, health) = run_requests(engine, tmp_path / "requests.jsonl")
    assert len(rows) == 4
    assert [r["request_id"] for r in rows] == ["req-one", fresh.headers["x-request-id"],
                                               bad.headers["x-request-id"], health.headers["x-request-id"]]
    assert re.fullmatch(r"[0-9a-f]{32}", rows[1]["request_id"])
    assert [r["status"] for r in rows] == [200, 200, 422, 200]
    assert all(r["event"] == "request" for r in rows)
    first = rows[0]
    body = ok.json()
    assert first["prompt_tokens"] == body["prompt_tokens"]
    assert first["completion_tokens"] == body["completion_tokens"]
    assert first["finish_reason"] == body["finish_reason"]
    for key in ("queue_ms", "inference_ms", "prefill_ms", "decode_ms"):
        assert first[key] == body["timing"][key]
    assert first["total_ms"] >= body["timing"]["total_ms"]  # the log may only know about the same or later
    assert rows[2]["error_code"] == "validation_error"
    assert rows[3]["path"] == "/health"


def test_prompt_and_output_text_are_not_logged(engine, tmp_path):
    path = tmp_path / "requests.jsonl"
    rows, (ok, *_rest) = run_requests(engine, path)
    text = path.read_text(encoding="utf-8")
    assert SECRET not in text
    assert all("prompt" not in r and "text" not in r for r in rows)


def test_text_is_logged_only_when_asked_for(engine, tmp_path):
    rows, (ok, *_rest) = run_requests(engine, tmp_path / "requests.jsonl", include_text=True)
    assert rows[0]["prompt"] == SECRET and rows[0]["text"] == ok.json()["text"]
