"""The HTTP routes. Each one wires dependencies to a function in service.py and nothing more."""
from __future__ import annotations

from fastapi import APIRouter

from tinystack.serve import service
from tinystack.serve.deps import Context, EngineDep, Runner, Validated
from tinystack.serve.schemas import ErrorResponse, GenerateResponse, HealthResponse

router = APIRouter()

_ERRORS = {code: {"model": ErrorResponse} for code in (400, 413, 422, 500, 503, 504)}


@router.post("/generate", response_model=GenerateResponse, responses=_ERRORS)  # type: ignore[arg-type]
async def generate(req: Validated, runner: Runner, ctx: Context) -> GenerateResponse:
    """Continue `prompt` with up to `max_tokens` new tokens; the answer carries timing in ms."""
    return await service.generate(req, runner, ctx)


@router.get("/health", response_model=HealthResponse)
async def health(runner: Runner, engine: EngineDep) -> HealthResponse:
    """Cheap liveness and load check; never waits for a generation."""
    return service.health(runner, engine)
