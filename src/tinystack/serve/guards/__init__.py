"""Guards in front of the engine.

API keys, per-key rate limits, the body-size limit, the admission gate and circuit breaker."""
