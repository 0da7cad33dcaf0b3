"""Helpers shared by the serving tests (a uniquely named module: every test folder has a conftest.py)."""
import time

PROMPT = "return the number of"


def wait_for(condition, timeout: float = 5.0) -> bool:
    """Poll `condition` until it holds or `timeout` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()
