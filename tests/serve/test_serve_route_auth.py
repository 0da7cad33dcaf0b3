"""Every route of the app needs an API key unless it is on the explicit open list (serve/api/deps.py): proven by
asking each route of `app.routes` without a key, and by adding a route that nobody thought about."""

import re

import httpx
import pytest
from fastapi import APIRouter

from tinystack.serve.api.deps import ADMIN_ROUTES, OPEN_ROUTES, PROBE_ROUTES

try:  # FastAPI >= 0.16x keeps an included router as one entry of app.routes: this lists the routes inside
    from fastapi.routing import iter_route_contexts
except ImportError:  # older FastAPI copies the routes into app.routes
    iter_route_contexts = iter

KEY = {"Authorization": "Bearer k1"}


def _calls(app):
    """(method, concrete path, route path) for every method of every route the app serves."""
    for route in iter_route_contexts(app.routes):
        path = re.sub(r"\{[^}]+\}", "ui.css", route.path)  # /ui/{name}: a file that exists
        for method in sorted(route.methods):
            yield method, path, route.path


def _refused(r: httpx.Response) -> bool:
    body = r.json()
    return (r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            and set(body["error"]) == {"message", "type", "param", "code"}
            and body["error"]["type"] == "authentication_error" and body["error"]["code"] == "invalid_api_key")


@pytest.mark.parametrize("open_health", [True, False])
def test_every_route_needs_a_key_or_is_on_the_open_list(serve, engine, monkeypatch, open_health):
    monkeypatch.setenv("TEST_KEYS", "k1")
    monkeypatch.setenv("TEST_ADMIN_KEYS", "a1")
    served = serve(engine, api_key_env="TEST_KEYS", open_health=open_health, admin_key_env="TEST_ADMIN_KEYS")
    paths = {route.path for route in iter_route_contexts(served.app.routes)}
    assert OPEN_ROUTES | PROBE_ROUTES <= paths  # the open list names routes that exist, nothing stale
    open_paths = OPEN_ROUTES | (PROBE_ROUTES if open_health else frozenset())
    asked = set()
    with httpx.Client(base_url=served.url, timeout=10) as c:
        for method, path, route_path in _calls(served.app):
            anonymous = c.request(method, path)
            if route_path in ADMIN_ROUTES:  # the admin keys, not the API keys (deps.require_admin)
                assert _refused(c.request(method, path, headers=KEY)), (method, path)
            keyed = c.request(method, path, headers={"Authorization": "Bearer a1"} if route_path in ADMIN_ROUTES
                              else KEY)
            assert keyed.status_code != 401, (method, path)  # the key is all the refusal was about
            if route_path in open_paths:
                assert anonymous.status_code == keyed.status_code == 200, (method, path, anonymous.text)
            else:
                assert _refused(anonymous), (method, path, anonymous.status_code, anonymous.text)
            asked.add(route_path)
    assert asked == paths and len(paths) >= 15  # every route was asked, not a sample


def test_a_route_added_without_thought_is_protected(serve, engine, monkeypatch):
    monkeypatch.setenv("TEST_KEYS", "k1")
    served = serve(engine, api_key_env="TEST_KEYS")
    extra = APIRouter()

    @extra.get("/new-report")
    async def report() -> dict:
        return {"secret": 42}

    served.app.include_router(extra)  # a new router, nothing said about keys

    @served.app.post("/new-action")  # and a route on the app itself
    async def action() -> dict:
        return {"done": True}

    with httpx.Client(base_url=served.url, timeout=10) as c:
        assert _refused(c.get("/new-report")) and _refused(c.post("/new-action"))
        assert _refused(c.get("/new-report", headers={"Authorization": "Bearer wrong"}))
        assert c.get("/new-report", headers=KEY).json() == {"secret": 42}
        assert c.post("/new-action", headers=KEY).json() == {"done": True}


def test_the_caller_id_reaches_rate_limits_without_the_route_checking_keys(serve, engine, monkeypatch):
    """The key check runs once, on the router; the routes that need the caller (rate limits) get its id."""
    monkeypatch.setenv("TEST_KEYS", "k1,k2")
    served = serve(engine, api_key_env="TEST_KEYS", rate_limit_rpm=1)
    body = {"prompt": "return the", "max_tokens": 1}
    with httpx.Client(base_url=served.url, timeout=10) as c:
        assert c.post("/generate", json=body, headers=KEY).status_code == 200
        assert c.post("/v1/completions", json=body, headers=KEY).status_code == 429  # k1's one request is spent
        assert c.post("/v1/completions", json=body, headers={"Authorization": "Bearer k2"}).status_code == 200
