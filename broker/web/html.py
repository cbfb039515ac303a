"""Plain string templates: every value goes through ``e()``; the page frame and small shared pieces."""

from __future__ import annotations

from html import escape
from urllib.parse import urlencode

from broker.web.session import Viewer

NAV = (("/", "Overview"), ("/jobs", "Jobs"), ("/clusters", "Clusters"), ("/teams", "Teams"), ("/market", "Market"),
       ("/simulate", "Simulate"))
CLOUD_COLOURS = {"aws": "#E69F00", "gcp": "#0072B2", "azure": "#009E73"}  # the report chart's
FALLBACK_COLOURS = ("#8e44ad", "#c0392b", "#27ae60", "#7f8c8d")
STATE_COLOURS = {"PENDING": "#bdc3c7", "PROVISIONING": "#f1c40f", "RUNNING": "#27ae60",
                 "CHECKPOINTING": "#e67e22", "MIGRATING": "#e74c3c", "SUCCEEDED": "#2c3e50",
                 "FAILED": "#7f0000", "CANCELLED": "#7f8c8d"}


def e(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def cloud_colour(cloud: str, others: list[str] | None = None) -> str:
    if cloud in CLOUD_COLOURS:
        return CLOUD_COLOURS[cloud]
    index = (others or []).index(cloud) if others and cloud in others else abs(hash(cloud))
    return FALLBACK_COLOURS[index % len(FALLBACK_COLOURS)]


def money(value: float) -> str:
    return f"-${-value:,.2f}" if value < 0 else f"${value:,.2f}"


def query(**params: object) -> str:
    return "?" + urlencode({k: v for k, v in params.items() if v not in (None, "")})


def table(headers: list[str], rows: list[list[str]], attrs: str = "") -> str:
    """A table whose cells are already-escaped HTML."""
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table {attrs}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def page(title: str, body: str, viewer: Viewer | None, active: str = "", scripts: tuple[str, ...] = ()) -> str:
    nav = ""
    if viewer is not None:
        links = "".join(f'<a href="{href}"{" class=active" if href == active else ""}>{e(name)}</a>'
                        for href, name in NAV)
        who = "admin (all teams)" if viewer.admin else f"team {viewer.team}"
        nav = (f'<nav>{links}<span class="who">{e(who)}</span>'
               f'<form method="post" action="/logout"><button type="submit">Sign out</button></form></nav>')
    tags = "".join(f'<script src="/static/{e(s)}"></script>' for s in scripts)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{e(title)} · spot broker</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/static/vendor/uPlot.min.css"><link rel="stylesheet" href="/static/dashboard.css">
<script src="/static/vendor/htmx.min.js"></script>{tags}
</head><body>{nav}<main><h1>{e(title)}</h1>
{body}
</main></body></html>"""
