"""What the routes do, kept out of the route functions: run a validated request, shape the answer.

    ValidatedRequest -> InferenceRunner.run (slot, worker thread, deadline)
        ok                 -> GenerateResponse(text, tokens, counts, finish_reason, timing)
        InferenceTimeout   -> ApiError 504 (the generation was cancelled)
        PromptTooLongError -> ApiError 400 (normally caught earlier, in validated_request)
        anything else      -> propagates: RequestContextMiddleware answers a generic 500
"""
from __future__ import annotations

from typing import Any

from tinystack.infer.engine import PromptTooLongError
from tinystack.serve.context import RequestContext
from tinystack.serve.deps import ValidatedRequest
from tinystack.serve.errors import TIMEOUT, ApiError
from tinystack.serve.runner import InferenceRunner, InferenceTimeout
from tinystack.serve.schemas import GenerateResponse, HealthResponse, Timing


async def generate(req: ValidatedRequest, runner: InferenceRunner, ctx: RequestContext) -> GenerateResponse:
    """Run one generation and build its response; records counts and finish_reason for the log line."""
    ctx.fields["prompt"] = req.body.prompt  # dropped by RequestLog unless it was set up with include_text
    try:
        gen = await runner.run(req.body.prompt, req.params, ctx.timing)
    except InferenceTimeout as e:
        ctx.fields["timeout_stage"] = e.stage
        raise ApiError(504, str(e), "timeout", TIMEOUT) from None
    except PromptTooLongError as e:
        raise ApiError(400, str(e), "prompt_too_many_tokens") from None
    ctx.fields.update(completion_tokens=len(gen.token_ids), finish_reason=gen.finish_reason, text=gen.text)
    ctx.mark_returned()
    return GenerateResponse.model_validate({
        "text": gen.text, "tokens": list(gen.token_ids), "prompt_tokens": gen.prompt_tokens,
        "completion_tokens": len(gen.token_ids), "finish_reason": gen.finish_reason,
        "timing": Timing.model_validate(ctx.timing.to_dict()),
    })


def health(runner: InferenceRunner, engine: Any) -> HealthResponse:
    """Liveness plus load: slots in use and requests waiting."""
    return HealthResponse(status="ok", max_concurrency=runner.max_concurrency, in_flight=runner.in_flight,
                          waiting=runner.waiting, max_seq_len=int(getattr(engine, "max_seq_len", 0)))
