"""Per-key rate limits kept in Redis, so every gateway process (or machine) shares each key's budget.

The same two token buckets as ratelimit.py (requests per minute, tokens per minute; a bucket holds
up to its per-minute rate and refills continuously), the same answers from `check(key, tokens)`,
selected by `[serve] redis_url`. One Lua script does read-refill-decide-take for both buckets of a
key atomically in Redis (no race between two gateways), on Redis's own clock (TIME), so gateways
whose clocks differ still agree. A key's state is a hash `tinystack:rl:<key>` {req, tok, t} that
expires once its buckets would be full again.

Redis unreachable -> the request is answered 503 (never let through unlimited, never a 500).
"""
from __future__ import annotations

import math

from tinystack.errors import require
from tinystack.serve.api.errors import SERVER_ERROR, ApiError

# KEYS[1] = the key's hash; ARGV = req_rate_per_min, tok_rate_per_min, token cost (a rate of 0 = off).
# Returns {allowed (0/1), wait in milliseconds (-1 = never fits), which ("requests"|"tokens"|"")}.
_SCRIPT = """
local rr, tr, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now_t = redis.call('TIME')
local now = tonumber(now_t[1]) + tonumber(now_t[2]) / 1e6
local s = redis.call('HMGET', KEYS[1], 'req', 'tok', 't')
local last = tonumber(s[3]) or now
local function level(v, rate)
  if rate <= 0 then return 0 end
  local l = tonumber(v) or rate
  return math.min(rate, l + (now - last) * rate / 60)
end
local req, tok = level(s[1], rr), level(s[2], tr)
local wait, which = 0, ''
for _, b in ipairs({{rr, req, 1, 'requests'}, {tr, tok, cost, 'tokens'}}) do
  local rate, lvl, c, name = b[1], b[2], b[3], b[4]
  if rate > 0 then
    if c > rate then return {0, -1, name} end
    local w = (c - lvl) / (rate / 60)
    if w > wait then wait, which = w, name end
  end
end
if wait > 0 then return {0, math.ceil(wait * 1000), which} end
if rr > 0 then req = req - 1 end
if tr > 0 then tok = tok - cost end
redis.call('HSET', KEYS[1], 'req', tostring(req), 'tok', tostring(tok), 't', tostring(now))
redis.call('EXPIRE', KEYS[1], 61)
return {1, 0, ''}
"""


class RedisRateLimiter:
    """RateLimiter's contract (`enabled`, `check`, the two rates) with the buckets in Redis at `url`."""

    def __init__(self, url: str, requests_per_min: float, tokens_per_min: float, prefix: str = "tinystack:rl:") -> None:
        redis = require("redis", "dist", "serve.redis_url (rate limits in Redis)")
        self.requests_per_min = requests_per_min
        self.tokens_per_min = tokens_per_min
        self.prefix = prefix
        self._redis = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        self._script = self._redis.register_script(_SCRIPT)
        self._errors = redis.RedisError

    @property
    def enabled(self) -> bool:
        return self.requests_per_min > 0 or self.tokens_per_min > 0

    def check(self, key: str, tokens: int) -> tuple[bool, int | None, str]:
        """(allowed, retry_after_s, which limit), as RateLimiter.check; takes the units only when allowed."""
        if not self.enabled:
            return True, 0, ""
        try:
            allowed, wait_ms, which = self._script(keys=[self.prefix + key],
                                                   args=[self.requests_per_min, self.tokens_per_min, tokens])
        except self._errors as e:
            raise ApiError(503, f"the rate-limit store is unavailable ({type(e).__name__}); retry later",
                           "rate_limit_store_unavailable", SERVER_ERROR, headers={"Retry-After": "1"}) from None
        which = which.decode() if isinstance(which, bytes) else str(which)
        if allowed:
            return True, 0, ""
        if wait_ms < 0:
            return False, None, which
        return False, max(1, math.ceil(wait_ms / 1000)), which
