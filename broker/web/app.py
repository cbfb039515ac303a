"""The dashboard's routes, mounted on the service's FastAPI app at ``/`` (pages) and ``/static``."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated
from urllib.parse import parse_qs

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from broker.clock import Clock
from broker.config.teams import FairShareConfig
from broker.errors import BrokerError
from broker.reports.window import ReportError, report_window
from broker.store import Store
from broker.web import clusters, jobs, market, market_gpu, overview, simulate, teams
from broker.web.html import e, page
from broker.web.session import COOKIE, Viewer, current_viewer, viewer_of_token
from broker.web.times import Times

CHARTS = ("vendor/uPlot.iife.min.js", "dashboard.js")

STATIC = Path(__file__).parent / "static"
MAX_FORM_BYTES = 4096


def _login_page(message: str = "", status: int = 200) -> HTMLResponse:
    note = f'<p class="error" role="alert">{e(message)}</p>' if message else ""
    body = (f'{note}<form class="login" method="post" action="/login">'
            '<label>API token <input type="password" name="token" autocomplete="off" autofocus></label>'
            '<button type="submit">Sign in</button></form>'
            "<p>Use a team's token from <code>broker token create --team NAME</code>; "
            "a token of team <code>admin</code> sees every team.</p>")
    return HTMLResponse(page("Sign in", body, None), status_code=status)


def _problem(viewer: Viewer, message: str, status: int) -> HTMLResponse:
    return HTMLResponse(page("Cannot show this", f'<p class="error" role="alert">{e(message)}</p>', viewer),
                        status_code=status)


async def _bounded_body(request: Request, limit: int) -> bytes | None:
    """The request body, or None as soon as it passes ``limit`` bytes (nothing more is read)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


class SignedOut(BrokerError):
    """No valid token in the request's cookie: a page redirects to sign-in, a live update gets 401."""


def _signed_out(request: Request, _exc: Exception) -> Response:
    if request.headers.get("HX-Request"):
        return Response("signed out", status_code=401)
    return RedirectResponse("/login", status_code=303)


def _signed_in(request: Request) -> Viewer:
    """Every page's first step: who is looking (the store is the one ``mount_dashboard`` was given)."""
    viewer = current_viewer(request.app.state.dashboard_store, request)
    if viewer is None:
        raise SignedOut()
    return viewer


Signed = Annotated[Viewer, Depends(_signed_in)]


def mount_dashboard(app: FastAPI, store: Store, clock: Clock, home: Path,
                    fair_share: FairShareConfig | None = None) -> None:
    times = Times(clock)  # every time shown on the wall clock, the replayed market's beside it
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.add_exception_handler(SignedOut, _signed_out)
    app.state.dashboard_store = store

    @app.get("/login", include_in_schema=False)
    def login_form() -> HTMLResponse:
        return _login_page()

    @app.post("/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        body = await _bounded_body(request, MAX_FORM_BYTES)
        if body is None:
            return _login_page("token: the form is too large", 413)
        try:
            form = parse_qs(body.decode("utf-8"), max_num_fields=5)
        except (UnicodeDecodeError, ValueError):
            return _login_page("token: expected a form with one token", 400)
        token = (form.get("token") or [""])[0].strip()
        if viewer_of_token(store, token) is None:
            return _login_page("token: unknown or revoked token", 401)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/")
        return response

    @app.post("/logout", include_in_schema=False)
    def logout() -> Response:
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    @app.get("/", include_in_schema=False)
    def overview_page(request: Request, viewer: Signed, since: str | None = None, to: str | None = None) -> Response:
        start = request.query_params.get("from")
        try:
            window = report_window(store, since, start, to)
        except ReportError as exc:
            return _problem(viewer, str(exc), 400)
        report = overview.build(store, viewer, window)
        return HTMLResponse(page("Overview", overview.render(report, since, start, to, times), viewer, "/",
                                 scripts=CHARTS))

    def _filter(request: Request) -> jobs.JobFilter:
        p = request.query_params
        return jobs.JobFilter.parse(p.get("state"), p.get("team"), p.get("q"), p.get("sort"), p.get("order"),
                                    p.get("after"))

    @app.get("/jobs", include_in_schema=False)
    def jobs_page(request: Request, viewer: Signed) -> Response:
        try:
            where = _filter(request)
        except ValueError as exc:
            return _problem(viewer, str(exc), 400)
        try:
            rows, total, more = jobs.list_jobs(store, viewer, where, clock.now())
        except jobs.NotFound as exc:
            return _problem(viewer, str(exc), 400)
        return HTMLResponse(page("Jobs", jobs.render_list(rows, total, where, viewer, times, more), viewer, "/jobs"))

    @app.get("/jobs/rows", include_in_schema=False)
    def job_rows(request: Request, viewer: Signed) -> Response:
        try:
            where = _filter(request)
        except ValueError as exc:
            return Response(str(exc), status_code=400)
        try:
            rows, _, _ = jobs.list_jobs(store, viewer, where, clock.now())
        except jobs.NotFound as exc:
            return Response(str(exc), status_code=400)
        return HTMLResponse(jobs.job_rows_html(rows, where, times))

    @app.get("/jobs/{job_id}", include_in_schema=False)
    def job_page(job_id: str, viewer: Signed) -> Response:
        now = clock.now()
        try:
            view = jobs.load_job(store, viewer, job_id, now)
        except jobs.NotFound:
            return _problem(viewer, f"no job {job_id!r} that you can see", 404)
        return HTMLResponse(page(f"Job {view.job.id}", jobs.render_job(view, home, now, times), viewer, "/jobs"))

    @app.get("/jobs/{job_id}/live", include_in_schema=False)
    def job_live(job_id: str, viewer: Signed) -> Response:
        now = clock.now()
        try:
            view = jobs.load_job(store, viewer, job_id, now)
        except jobs.NotFound:
            return Response(f"no job {job_id!r} that you can see", status_code=404)
        return HTMLResponse(jobs.job_live_html(view, now, times))

    def _clusters(viewer: Viewer) -> str:
        body = clusters.render(clusters.load_clusters(store, viewer), clock.now(), times)
        return f'<div id="clusters" hx-get="/clusters/live" hx-trigger="every 5s" hx-swap="outerHTML">{body}</div>'

    @app.get("/clusters", include_in_schema=False)
    def clusters_page(viewer: Signed) -> Response:
        return HTMLResponse(page("Clusters", times.note() + _clusters(viewer), viewer, "/clusters"))

    @app.get("/clusters/live", include_in_schema=False)
    def clusters_live(viewer: Signed) -> Response:
        return HTMLResponse(_clusters(viewer))

    @app.get("/teams", include_in_schema=False)
    def teams_page(viewer: Signed) -> Response:
        from broker.config.teams import FairShareConfig as Config
        from broker.status.teams import team_lines
        from broker.web.team_chart import load_usage

        config = fair_share or Config(teams=())
        now = clock.now()
        with store.transaction() as s:
            series = load_usage(s, config, now)
        body = teams.render(team_lines(store, config, now), viewer, config.capacity_gpus, series)
        return HTMLResponse(page("Teams", body, viewer, "/teams"))

    @app.get("/market", include_in_schema=False)
    def market_page(request: Request, viewer: Signed) -> Response:
        try:
            where = market.MarketFilter.parse(request.query_params)
        except market.MarketQueryError as exc:
            return _problem(viewer, str(exc), 400)
        data = market.load_market(store, viewer, datetime.now(UTC), where, clock.now())
        data["times"] = times
        return HTMLResponse(page("Market", market.render(data, where), viewer, "/market"))

    @app.get("/market/gpu/{gpu}", include_in_schema=False)
    def market_gpu_page(gpu: str, viewer: Signed) -> Response:
        try:
            name = market.MarketFilter.parse({"gpu": gpu}).gpu or ""
        except market.MarketQueryError as exc:
            return _problem(viewer, str(exc), 400)
        data = market_gpu.load_gpu_type(store, name, datetime.now(UTC), clock.now())
        if data is None:
            return _problem(viewer, f"gpu: no quote for {name!r} in the last 7 days", 404)
        return HTMLResponse(page(f"Market: {name}", market_gpu.render_gpu_type(data), viewer, "/market",
                                 scripts=CHARTS))

    @app.get("/simulate", include_in_schema=False)
    def simulate_form(viewer: Signed) -> Response:
        return HTMLResponse(page("Simulate", simulate.form_html(), viewer, "/simulate", scripts=("dashboard.js",)))

    @app.post("/simulate", include_in_schema=False)
    async def simulate_run(request: Request, viewer: Signed) -> Response:
        from starlette.concurrency import run_in_threadpool


        def refused(message: str, status: int, job: str = simulate.EXAMPLE_JOB, choice: str = "quickstart") -> Response:
            body = f'<p class="error" role="alert">{e(message)}</p>' + simulate.form_html(job, choice)
            return HTMLResponse(page("Simulate", body, viewer, "/simulate", scripts=("dashboard.js",)),
                                status_code=status)

        raw = await _bounded_body(request, simulate.MAX_FORM_BYTES)
        if raw is None:
            return refused(f"upload: larger than {simulate.MAX_FORM_BYTES // 2**20} MB; expected a smaller trace", 413)
        try:
            form = parse_qs(raw.decode("utf-8"), max_num_fields=10, keep_blank_values=True)
            job, choice, upload = simulate.check_form(form)
        except (UnicodeDecodeError, ValueError) as exc:
            status = exc.status if isinstance(exc, simulate.SimulateError) else 400
            message = str(exc) if isinstance(exc, simulate.SimulateError) else "upload: expected UTF-8 form text"
            return refused(message, status)
        try:
            outcome = await run_in_threadpool(simulate.run, job, choice, upload)
        except simulate.SimulateError as exc:
            return refused(str(exc), exc.status, job, choice)
        body = simulate.result_html(outcome) + simulate.form_html(job, choice)
        return HTMLResponse(page("Simulate", body, viewer, "/simulate", scripts=("dashboard.js",)))
