"""Request bodies parsed as JSON Schema reads numbers: a number with no fraction is an integer, exactly.

Python's json module turns `5.0`, `1e3` and `9223372036854775807.0` into floats, and a float holds integers
exactly only up to 2**53: the last becomes 2**63 and fails a `maximum` of 2**63 - 1 that the written number
meets. Here every JSON number with a fraction or exponent whose value is whole (and below 1e30, so `1e999999999`
is never expanded into digits) becomes that exact int; the rest stay floats. So an integer field takes 5.0 as 5,
as /openapi.json's "integer" promises (and OpenAI does), a float field takes the int as the same number, and a
field's bounds are checked on the number the client wrote.

    ExactJsonRoute    the router's route class: its requests parse their body with `loads`
"""
from __future__ import annotations

import json
from decimal import Decimal
from typing import Any, Callable, Coroutine

from fastapi import Request, Response
from fastapi.routing import APIRoute

_WHOLE_DIGITS = 30  # whole numbers below 1e30 become ints; larger ones no integer field takes anyway


def _number(text: str) -> int | float:
    exact = Decimal(text)  # JSON's grammar for a number is Decimal's too: no arithmetic, nothing can overflow
    # adjusted(): the exponent of the leading digit, read off the written form (1e999999999 stays 2 fields)
    if exact.is_finite() and exact.adjusted() < _WHOLE_DIGITS and exact == exact.to_integral_value():
        return int(exact)
    return float(text)


def loads(body: bytes | str) -> Any:
    return json.loads(body, parse_float=_number)


class _ExactJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads(await self.body())
        return self._json


class ExactJsonRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def exact_json_handler(request: Request) -> Response:
            return await handler(_ExactJsonRequest(request.scope, request.receive))

        return exact_json_handler
