"""The browser's side of the server: the dashboard page at ``/`` with its assets under
``/static`` (all shipped in the package; no CDN, no build step), the recent history the
dashboard charts (``/api/cluster/history``, ``/api/jobs/{ref}/history``) and the
Prometheus scrape endpoint ``/metrics``.

Every route here sits behind the same authentication as the rest of the API (the app's
token check applies to every path): a browser opens the page through its ``?token=``
link and then holds a dashboard session (:mod:`pollux.service.http.sessions`): its cookie
opens the page and assets, and the page's script sends the session's CSRF token with
every API request, including the job's cancel button.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from pollux.service.http.authorization import JobAction, may_act
from pollux.service.http.openapi import STATIC_PREFIX
from pollux.service.http.sessions import LOGIN_QUERY, LOGIN_TTL_S
from pollux.service.http.user_routes import authorize_job, principal_of, visible_summary
from pollux.service.loop.telemetry import job_sample, samples_as_columns
from pollux.service.server import SchedulerService

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STATIC_DIR = Path(__file__).resolve().parent / "static"


DASHBOARD_FINISHED_JOBS = 50
"""Finished jobs the dashboard shows (the newest; every active job too): the page polls
every 2 s, so its query is bounded however many jobs the store keeps."""


def dashboard_view(service: SchedulerService) -> dict[str, Any]:
    now = service.clock()
    records = service.store.list_recent(DASHBOARD_FINISHED_JOBS)  # one read for all
    jobs = service.summaries(records)
    samples = {record.id: job_sample(record, now)
               for record in records if not record.state.is_final}
    for job in jobs:
        sample = samples.get(job["id"])
        job["speedup"] = None if sample is None else sample.speedup
        job["efficiency"] = None if sample is None else sample.efficiency
    active = [record for record in records if not record.state.is_final]
    return {"time": now, "health": service.health(), "cluster": service.cluster(),
            "nodes": service.nodes(active), "jobs": jobs,
            "history": samples_as_columns(service.history.cluster())}


def add_dashboard(app: FastAPI, service: SchedulerService) -> None:
    """Mount the page, its assets, the history endpoints and ``/metrics`` on ``app``."""
    app.mount(STATIC_PREFIX, StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html",
                            headers={"Cache-Control": "no-cache"})

    @app.post("/api/dashboard/login", status_code=201, tags=["dashboard"])
    def login_link(request: Request) -> dict[str, Any]:
        """A one-time link that opens the dashboard in a browser (one use, within
        ``expires_in_s``): the token itself need not go into the browser. Needs the
        token (a dashboard session cannot ask)."""
        code = request.app.state.sessions.create_login(principal_of(request).name)
        return {"path": f"/?{urlencode({LOGIN_QUERY: code})}", "expires_in_s": LOGIN_TTL_S,
                "url": getattr(request.app.state, "url", None)}

    @app.get("/api/dashboard", tags=["dashboard"], response_model=dict[str, Any])
    def overview(request: Request) -> Response:
        """Everything the dashboard's page shows but one job's details, in one request:
        health, cluster size, nodes with the jobs holding their slots, jobs (with their
        speedup and efficiency now) and the cluster's history; of others' jobs what
        every user sees (their id, name, owner, team, state and GPUs)."""
        view = dashboard_view(service)
        principal = principal_of(request)
        view["user"] = principal.name
        view["teams"] = service.team_usage() if service.users.count() or service.teams \
            else []
        view["jobs"] = [{**visible_summary(principal, job),
                         "may_act": may_act(principal, job["owner"], job["team"])}
                        for job in view["jobs"]]
        return JSONResponse(view)  # plain JSON: no re-encoding

    @app.get("/api/cluster/history", tags=["dashboard"])
    def cluster_history() -> dict[str, Any]:
        """One sample per scheduling round (time, slots_used, slots_total,
        num_active_jobs, round_s), as columns; recent rounds only, kept in memory."""
        return {"samples": samples_as_columns(service.history.cluster())}

    @app.get("/api/jobs/{ref}/history", tags=["dashboard"])
    def job_history(ref: str, request: Request) -> dict[str, Any]:
        """One sample per scheduling round of the job (time, state, replicas, nodes,
        batch_size, goodput, efficiency), as columns (a user's own jobs only)."""
        record = authorize_job(service, request, ref, JobAction.READ)
        return {"job": record.id, "samples": samples_as_columns(service.history.job(record.id))}

    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> Response:
        """Prometheus' scrape: every gauge, but each job's goodput and batch size only
        where the requester may read the job (the server's token or an admin's: all)."""
        if service.metrics is None:
            return Response("prometheus_client is not installed\n", status_code=404,
                            media_type="text/plain")
        principal = principal_of(request)
        return Response(service.metrics.exposition(
            lambda record: may_act(principal, record.owner, record.team)),
            media_type=METRICS_CONTENT_TYPE)
