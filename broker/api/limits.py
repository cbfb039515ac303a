"""What one request may cost the service: body size, JSON depth, NULs in the target, a time budget.

``RequestLimits`` is the outermost ASGI layer, so a request over a limit is refused before any
route, JSON parser or database sees it. An API call without a bearer token is refused before its
body is read. Bodies are read once, counted and depth-checked as they arrive, in time linear in
their size (a lying or absent ``Content-Length`` does not help), and handed on to the app unchanged.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from itertools import accumulate
from typing import Any
from urllib.parse import parse_qsl, unquote_to_bytes

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# A job file may be 1,000,000 characters; JSON escaping of its newlines and quotes needs room.
MAX_BODY_BYTES = 2 * 1024 * 1024
# The deepest body a route takes is 2 levels; 32 leaves room and stops recursion bombs.
MAX_JSON_DEPTH = 32
# Routes take a handful of arrays and objects; parsing and validating hundreds of thousands of them
# holds the event loop for a second per 2 MB (strings and numbers cost a tenth of that).
MAX_JSON_CONTAINERS = 10_000
# Longest URL path plus query string; ids, states and offsets are all short.
MAX_TARGET_BYTES = 8192
# Generous: the first submission after a start loads SkyPilot's catalog, which takes tens of seconds
# on a busy machine.
TIME_BUDGET_SECONDS = 120.0
# A write is not begun with less than this part of the budget left, so a request answered 503
# has not stored anything behind the caller's back (its worker thread cannot be stopped).
WRITE_MARGIN = 0.2
# The depth scan yields to other requests after each slice this long (a few ms of work at worst).
SCAN_SLICE_BYTES = 8192
# API paths anyone may call; every other path under /v1/ needs a bearer token, so a call without one
# is refused before its body is read (the routes check the token itself).
PUBLIC_API_PATHS = frozenset({"/v1/health"})

# A string's inside up to its closing quote or the chunk's end (a lone backslash there escapes the
# next chunk's first byte); possessive, so it never backtracks, and it always matches, so a scan is
# never restarted: that restart on every quote made the former pattern quadratic.
_STRING_REST = rb'(?:[^"\\]++|\\.)*+(?:(?P<closed>")|(?P<lone>\\)?\Z)'
_STRING_REST_RE = re.compile(_STRING_REST, re.DOTALL)
# One left-to-right pass over what is not brackets: a run of closed strings with no bracket between
# them, a string (maybe going on in the next chunk), or a backslash outside a string (not JSON: a
# parser stops there). Linear in the bytes scanned.
_STRING_OR_ESCAPE = re.compile(rb'(?P<run>(?:"(?:[^"\\]++|\\.)*+"[^"\[\]{}\\]*+)++)|"' + _STRING_REST + rb'|\\',
                               re.DOTALL)
# Between strings only brackets count: the rest is deleted and each bracket becomes +1 or -1.
_NOT_BRACKETS = bytes(byte for byte in range(256) if byte not in b"[]{}")
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_OPENING = b"[{"
_FEW_BRACKETS = 8  # up to this many are counted one by one; more, through accumulate in C


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = MAX_BODY_BYTES
    max_json_depth: int = MAX_JSON_DEPTH
    max_json_containers: int = MAX_JSON_CONTAINERS
    max_target_bytes: int = MAX_TARGET_BYTES
    time_budget_s: float = TIME_BUDGET_SECONDS
    # Routes that take more and bound their bodies themselves, with a message naming their field:
    # the dashboard's simulate form (an uploaded market trace, at most 8 MB).
    larger_bodies: tuple[tuple[str, int], ...] = (("/simulate", 9 * 1024 * 1024),)

    def body_limit(self, path: str) -> int:
        return next((limit for route, limit in self.larger_bodies if route == path), self.max_body_bytes)


class JsonDepth:
    """How deeply arrays and objects nest in a body fed in chunks, without parsing it (brackets inside
    strings skipped). Linear in the bytes fed and never looks back at an earlier chunk, so a request's
    body is checked as it arrives: a hostile body costs at most a pass over what the size limit lets in."""

    def __init__(self) -> None:
        self.depth = self.deepest = 0
        self.containers = 0  # arrays and objects opened so far
        self.in_string = False
        self.escaped = False  # the last chunk ended with a backslash: the next byte is escaped
        # A bracket closed more often than opened, or a backslash outside a string: not JSON, and a
        # parser stops there, so nothing after it can nest deeper for anyone. Scanning stops too.
        self.not_json = False

    def feed(self, chunk: bytes) -> int:
        position = 0
        if self.escaped and chunk:
            self.escaped, position = False, 1
        if self.in_string and position < len(chunk):
            rest = _STRING_REST_RE.match(chunk, position)
            assert rest is not None  # the pattern matches at any position
            self._note_string(rest)
            position = rest.end()
        for token in _STRING_OR_ESCAPE.finditer(chunk, position):
            if self.not_json:
                return self.deepest
            start, end = token.span()
            if start > position:
                self._brackets(chunk[position:start])
            position = end
            if token.group("run") is not None:
                continue
            if chunk[start] == 0x22:  # a string, maybe going on in the next chunk
                self._note_string(token)
            else:
                self.not_json = True
        if position < len(chunk) and not self.not_json:
            self._brackets(chunk[position:])
        return self.deepest

    def _brackets(self, between_strings: bytes) -> None:
        brackets = between_strings.translate(None, _NOT_BRACKETS)
        if not brackets or self.not_json:
            return
        self.containers += brackets.count(b"[") + brackets.count(b"{")
        if len(brackets) <= _FEW_BRACKETS:  # most gaps between strings: '{', '},{', ']}'
            depth, deepest = self.depth, self.deepest
            for bracket in brackets:
                depth += 1 if bracket in _OPENING else -1
                deepest = max(deepest, depth)
                if depth < 0:
                    self.not_json = True
                    break
            self.depth, self.deepest = depth, deepest
            return
        depths = list(accumulate(memoryview(brackets.translate(_STEPS)).cast("b"), initial=self.depth))
        if min(depths) < 0:  # count only up to where a parser stops
            self.not_json = True
            del depths[depths.index(-1):]
        self.deepest = max(self.deepest, max(depths))
        self.depth = depths[-1]

    def _note_string(self, match: re.Match[bytes]) -> None:
        self.in_string = match.group("closed") is None
        self.escaped = match.group("lone") is not None


def json_depth(body: bytes) -> int:
    """How deeply arrays and objects nest in ``body``, without parsing it (brackets in strings skipped)."""
    return JsonDepth().feed(body)


def target_problem(scope: Scope, limit: int) -> str | None:
    """Why the URL path or query string cannot be served (too long, a NUL), naming the part."""
    raw_path = scope.get("raw_path") or str(scope.get("path", "")).encode()
    query: bytes = scope.get("query_string") or b""
    if len(raw_path) + len(query) > limit:
        return f"URL: longer than {limit} bytes"
    if b"\x00" in unquote_to_bytes(raw_path):
        return "path: contains a NUL byte"
    try:
        pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True, errors="strict")
    except (UnicodeDecodeError, ValueError):
        return "query string: not valid URL encoding"
    for name, value in pairs:
        if "\x00" in name or "\x00" in value:
            return f"query parameter {name.replace(chr(0), '') or '?'!r}: contains a NUL byte"
    return None


def bearer_missing(scope: Scope) -> bool:
    """True for an API call that needs a token and carries none: it is answered 401 unread."""
    path = str(scope.get("path", ""))
    if not path.startswith("/v1/") or path in PUBLIC_API_PATHS:
        return False
    authorization = dict(scope.get("headers") or []).get(b"authorization", b"")
    return authorization[:7].lower() != b"bearer " or not authorization[7:].strip()


async def refuse(send: Send, status: int, message: str, field: list[str] | None = None,
                 extra_headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """Answer with the API's error shape: ``detail`` (with ``loc`` when a field is named) and ``message``.
    The connection is closed after it: the refused request's body may not have been read."""
    detail: Any = [{"loc": field, "msg": message, "type": "limit"}] if field else message
    body = json.dumps({"detail": detail, "message": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *extra_headers]})
    await send({"type": "http.response.body", "body": body})


class RequestLimits:
    def __init__(self, app: ASGIApp, limits: Limits | None = None) -> None:
        self.app = app
        self.limits = limits or Limits()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limits = self.limits
        problem = target_problem(scope, limits.max_target_bytes)
        if problem is not None:
            await refuse(send, 400, problem)
            return
        if bearer_missing(scope):
            await refuse(send, 401, "missing bearer token: send `Authorization: Bearer <token>`",
                         extra_headers=((b"www-authenticate", b"Bearer"),))
            return
        max_body = limits.body_limit(scope.get("path", ""))
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > max_body):
            await refuse(send, 413, f"body: larger than {max_body} bytes", ["body"])
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        depth = JsonDepth()
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > max_body:
                await refuse(send, 413, f"body: larger than {max_body} bytes", ["body"])
                return
            problem = await _scan(depth, chunk, limits)
            if problem is not None:
                await refuse(send, 422, problem, ["body"])
                return
            chunks.append(chunk)
            more = bool(message.get("more_body"))
        body = b"".join(chunks)
        scope.setdefault("state", {})["deadline"] = time.monotonic() + limits.time_budget_s * (1 - WRITE_MARGIN)
        await self._within_budget(scope, _replay(body), send)

    async def _within_budget(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await asyncio.wait_for(self.app(scope, receive, tracked), self.limits.time_budget_s)
        except TimeoutError:
            if not started:
                await refuse(send, 503, f"request took longer than its {self.limits.time_budget_s:g} s budget")


async def _scan(depth: JsonDepth, chunk: bytes, limits: Limits) -> str | None:
    """Feed ``chunk`` a slice at a time, letting other requests run between slices (a receive whose
    data is already buffered does not yield, so a fast client's 2 MB would otherwise be one long
    hold); what is wrong at the first slice that goes past a limit, else None."""
    for start in range(0, len(chunk), SCAN_SLICE_BYTES):
        if depth.feed(chunk[start:start + SCAN_SLICE_BYTES]) > limits.max_json_depth:
            return f"body: nested deeper than {limits.max_json_depth} levels"
        if depth.containers > limits.max_json_containers:
            return f"body: more than {limits.max_json_containers} arrays and objects"
        await asyncio.sleep(0)
    return None


def out_of_time(state: Any) -> bool:
    """True when the request's budget is nearly spent: too late to begin a write."""
    deadline = getattr(state, "deadline", None)
    return deadline is not None and time.monotonic() > deadline


def _replay(body: bytes) -> Receive:
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()  # nothing more comes: wait as a quiet client would
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive
