"""The HTTP surface: request/response schemas, routes, the OpenAI error shape, middleware, per-request context."""
