"""Request validation that names the field and never echoes the input back.

Bodies are read by ``json_body`` as a dependency declared after the route's authentication, so a
caller without a valid token gets 401 before anything about the body is said. String fields
refuse NUL bytes and carry the length of the column they end up in, so PostgreSQL never sees a
value it would refuse. A lone surrogate escaped in the JSON (``"\\ud800"``), which pydantic's parser
refuses for the whole body, is refused naming the field that holds it, inside a job file's text (a
``Document`` field) the job file's field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Document:
    """Marks a field holding a document another reader checks field by field (a job file's YAML).
    ``locate`` gives, for text holding a lone surrogate, the path of the document's field that holds
    it and a message, so that a refusal names that field."""

    locate: Callable[[str], tuple[tuple[str | int, ...], str]]


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
            errors = exc.errors(include_input=False)
            if any(e["type"] == "json_invalid" for e in errors):
                _with_lone_surrogates(model, raw)
            raise RequestValidationError([{**e, "loc": ("body", *e.get("loc", ()))} for e in errors]) from None

    return read


_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")
SURROGATE_MESSAGE = "contains a lone surrogate (not valid Unicode text)"


def _with_lone_surrogates(model: type[Model], raw: bytes) -> None:
    """A body pydantic's JSON parser refused, read again by Python's, which takes an escaped lone
    surrogate: refused naming the first field that holds one (inside a ``Document`` field, the
    document's own field). Returns when Python's parser refuses it too or finds none (the first
    refusal stands).

    The body has passed the request limits (size, depth, container count), and ``json.loads`` is
    linear in it."""
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return
    documents = {name: next(m for m in info.metadata if isinstance(m, Document))
                 for name, info in model.model_fields.items() if any(isinstance(m, Document) for m in info.metadata)}
    for path in _lone_surrogates(data, ()):
        message = SURROGATE_MESSAGE
        if len(path) == 1 and path[0] in documents and isinstance(data, dict) and isinstance(data[path[0]], str):
            inner, message = documents[str(path[0])].locate(data[path[0]])
            path = (*path, *inner)
        raise RequestValidationError([{"loc": ("body", *path), "msg": message, "type": "string_unicode"}])


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _lone_surrogates(value: Any, path: tuple[str | int, ...]) -> Iterator[tuple[str | int, ...]]:
    """The path of every string (key or value) holding a lone surrogate; a key's is its object's."""
    if isinstance(value, str):
        if _LONE_SURROGATE.search(value):
            yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _lone_surrogates(key, path)
            yield from _lone_surrogates(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _lone_surrogates(item, (*path, index))


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` documenting a body that ``json_body`` reads."""
    return {"requestBody": {"required": True,
                            "content": {"application/json": {"schema": model.model_json_schema()}}}}
