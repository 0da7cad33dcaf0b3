"""Between HTTP and tinystack.infer: the engine adapter, one request's execution with its protections, streaming deltas, timing, the watchdog."""
