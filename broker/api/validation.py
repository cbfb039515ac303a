"""Request validation that names the field and never echoes the input back.

Bodies are read by ``json_body`` as a dependency declared after the route's authentication, so a
caller without a valid token gets 401 before anything about the body is said. String fields
refuse NUL bytes and carry the length of the column they end up in, so PostgreSQL never sees a
value it would refuse.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import AfterValidator, BaseModel, ValidationError

Model = TypeVar("Model", bound=BaseModel)

# Datetimes outside these years are refused: they cannot be meant, and arithmetic on them overflows.
EARLIEST_YEAR = 1970
LATEST_YEAR = 2200


def no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("contains a NUL byte")
    return value


def sane_datetime(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    if not EARLIEST_YEAR <= value.year <= LATEST_YEAR:
        raise ValueError(f"expected a time between {EARLIEST_YEAR} and {LATEST_YEAR}, got year {value.year}")
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def plain_line(value: str) -> str:
    """One line of text with no control character (C0, DEL, C1) and no lone surrogate: a path or name
    that is printed, logged or resolved later."""
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise ValueError("control characters, NUL and lone surrogates are not allowed")
    return value


def query_problem(field: str, message: str) -> Exception:
    """A 422 naming a query parameter, as FastAPI's own validation names it."""
    from fastapi import HTTPException

    return HTTPException(422, f"{field}: {message}")


def job_state(value: str) -> str:
    """A ``state`` filter: one of the job states (any case), else a 422 naming it."""
    from broker.model import JobState

    states = {s.value for s in JobState}
    if value.upper() not in states:
        raise query_problem("state", f"expected one of {', '.join(sorted(states))}")
    return value.upper()


def plain_line_of(value: str, field: str) -> str:
    """``plain_line`` for a query parameter: a 422 naming ``field``."""
    try:
        return plain_line(value)
    except ValueError as exc:
        raise query_problem(field, str(exc)) from None


Text = Annotated[str, AfterValidator(no_nul)]
PlainLine = Annotated[str, AfterValidator(plain_line)]
When = Annotated[datetime | None, AfterValidator(sane_datetime)]


def where(loc: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(str(part) for part in loc) or "body"


def one_line(errors: list[dict[str, Any]]) -> str:
    return "; ".join(f"{where(e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in errors)


def problems(errors: Any) -> list[dict[str, Any]]:
    """Validation errors without ``input``/``ctx`` (a huge or hostile value is not sent back)."""
    return [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "invalid")), "type": str(e.get("type", ""))}
            for e in errors]


async def validation_error_response(request: Request, exc: Exception) -> JSONResponse:
    errors = problems(exc.errors() if isinstance(exc, (RequestValidationError, ValidationError)) else [])
    return JSONResponse(status_code=422, content={"detail": errors, "message": one_line(errors)})


async def user_error_response(request: Request, exc: Exception) -> JSONResponse:
    """A user error no route caught: its one-line message, with its class's 4xx status."""
    return JSONResponse(status_code=getattr(exc, "http_status", 422), content={"detail": str(exc)})


def json_body(model: type[Model]) -> Callable[[Request], Awaitable[Model]]:
    """A dependency reading the body as ``model``; declare it after the route's authentication."""

    async def read(request: Request) -> Model:
        raw = await request.body()
        try:
            return model.model_validate_json(raw or b"null")
        except ValidationError as exc:
            raise RequestValidationError(
                [{**e, "loc": ("body", *e.get("loc", ()))} for e in exc.errors(include_input=False)]) from None

    return read


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` documenting a body that ``json_body`` reads."""
    return {"requestBody": {"required": True,
                            "content": {"application/json": {"schema": model.model_json_schema()}}}}
