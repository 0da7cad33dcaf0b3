"""Between HTTP and tinystack.infer.

The engine adapter, one request's execution with its protections, streaming deltas, timing, the watchdog."""
