"""``/docs``: the HTTP API's reference, rendered on the server from the app's own OpenAPI schema.

No script and nothing fetched from elsewhere (FastAPI's Swagger page loads its code from a CDN):
every operation with its parameters, body and answers, and each body's schema, on one page;
``/openapi.json`` is the same schema for tools.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from broker.web.html import e

STYLE = """body{font:15px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1000px;padding:1em 2em;color:#222}
code,pre{font:13px ui-monospace,monospace}pre{background:#f4f4f4;padding:.6em;overflow-x:auto}
section.op{border-top:1px solid #ddd;padding:.4em 0}h2 code{font-size:1em}.method{font-weight:bold;
text-transform:uppercase;margin-right:.5em}table{border-collapse:collapse}td,th{border:1px solid #ddd;
padding:2px 8px;text-align:left;vertical-align:top}"""
METHODS = ("get", "post", "put", "patch", "delete")


def _schema_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _type_of(schema: dict[str, Any]) -> str:
    """A short type name: a linked schema name, ``array of X``, or the JSON type."""
    if "$ref" in schema:
        name = _schema_name(schema["$ref"])
        return f'<a href="#schema-{e(name)}">{e(name)}</a>'
    if "anyOf" in schema:
        return " or ".join(_type_of(s) for s in schema["anyOf"])
    if schema.get("type") == "array":
        return f"array of {_type_of(schema.get('items', {}))}"
    return e(schema.get("type", "any"))


def _parameters(op: dict[str, Any]) -> str:
    params = op.get("parameters", [])
    if not params:
        return ""
    rows = "".join(f"<tr><td><code>{e(p['name'])}</code></td><td>{e(p.get('in', ''))}</td>"
                   f"<td>{'yes' if p.get('required') else 'no'}</td><td>{_type_of(p.get('schema', {}))}</td>"
                   f"<td>{e(p.get('description', ''))}</td></tr>" for p in params)
    return ("<h3>Parameters</h3><table><thead><tr><th>name</th><th>in</th><th>required</th><th>type</th>"
            f"<th>description</th></tr></thead><tbody>{rows}</tbody></table>")


def _body(op: dict[str, Any]) -> str:
    body = op.get("requestBody")
    if not body:
        return ""
    parts = "".join(f"<p><code>{e(kind)}</code>: {_type_of(media.get('schema', {}))}</p>"
                    for kind, media in body.get("content", {}).items())
    return f"<h3>Body{' (required)' if body.get('required') else ''}</h3>{parts}"


def _responses(op: dict[str, Any]) -> str:
    rows = []
    for code, answer in op.get("responses", {}).items():
        kinds = ", ".join(_type_of(m.get("schema", {})) for m in answer.get("content", {}).values())
        rows.append(f"<tr><td>{e(code)}</td><td>{e(answer.get('description', ''))}</td><td>{kinds}</td></tr>")
    return ("<h3>Answers</h3><table><thead><tr><th>status</th><th>meaning</th><th>body</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def render(schema: dict[str, Any]) -> str:
    info = schema.get("info", {})
    ops, index = [], []
    for path, item in sorted(schema.get("paths", {}).items()):
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            anchor = f"{method}-{path}".replace("/", "-").replace("{", "").replace("}", "")
            index.append(f'<li><a href="#{e(anchor)}"><span class="method">{method}</span>{e(path)}</a> '
                         f"{e(op.get('summary', ''))}</li>")
            text = op.get("description") or ""
            ops.append(f'<section class="op" id="{e(anchor)}"><h2><span class="method">{method}</span>'
                       f"<code>{e(path)}</code></h2><p>{e(op.get('summary', ''))}</p>"
                       + (f"<pre>{e(text)}</pre>" if text and text != op.get("summary") else "")
                       + _parameters(op) + _body(op) + _responses(op) + "</section>")
    schemas = "".join(f'<section id="schema-{e(name)}"><h3>{e(name)}</h3><pre>{e(json.dumps(body, indent=2))}</pre>'
                      "</section>" for name, body in sorted(schema.get("components", {}).get("schemas", {}).items()))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{e(info.get('title', 'API'))} · API reference</title>
<link rel="icon" href="data:,"><style>{STYLE}</style></head><body>
<h1>{e(info.get('title', 'API'))} {e(info.get('version', ''))}: HTTP API</h1>
<p>Calls carry a bearer token, <code>Authorization: Bearer TOKEN</code>: a team's
(<code>broker token create --team NAME</code>) for jobs, prices and reports; a node agent's (the one
its cluster was given) for notices, checkpoints and progress. The same schema for tools:
<a href="/openapi.json">/openapi.json</a>.</p>
<ul>{''.join(index)}</ul>{''.join(ops)}<h2>Schemas</h2>{schemas}</body></html>"""


def mount_api_docs(app: FastAPI) -> None:
    """Serve the reference at ``/docs`` (the app keeps FastAPI's ``/openapi.json``)."""
    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return HTMLResponse(render(app.openapi()))
