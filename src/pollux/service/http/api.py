"""The REST API (FastAPI). Thin: parses, checks tokens, calls the service, formats.

Errors are JSON ``{"detail": message, "field": name}``: 400 malformed body (or a Host
this server does not answer to), 401 missing or wrong token, 403 a job token used for
another job (or a foreign Origin), 404 unknown job, 413 body too large, 415 a body that
is not ``application/json``, 422 a field with a bad value (the field is named; an
integer too long to read too), 500 the job store (or one job's record) is damaged (the
message names it and the fix: ``pollux server --recover``), 503 the job store is busy
(retry), 507 the data directory is full (nothing was stored).

Every request needs the server's token (see :mod:`pollux.service.http.auth`, which guards
every route of the app). The hints endpoint instead takes the job's own hints token (or
the server token), checked before it says whether the job exists.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from pollux import __version__
from pollux.errors import (
    ConfigError,
    ForbiddenError,
    StoreDamagedError,
    StoreUnavailableError,
    UnknownJobError,
    UnknownPluginError,
    UnknownUserError,
)
from pollux.service.http.auth import (
    ApiAuth,
    bearer_token,
    error_response,
    install_guard,
    tokens_match,
)
from pollux.service.http.authorization import JobAction, submit_team
from pollux.service.http.dashboard import add_dashboard
from pollux.service.http.identities import Identities
from pollux.service.http.openapi import SUBMIT_OPENAPI, add_offline_docs, add_schemas
from pollux.service.http.rate_limit import RateLimit, RateLimiter
from pollux.service.http.sessions import Sessions
from pollux.service.http.user_routes import (
    add_user_routes,
    authorize_job,
    principal_of,
    visible_summary,
)
from pollux.service.server import (
    DEFAULT_EVENTS_LISTED,
    DEFAULT_FINISHED_LISTED,
    MAX_LISTED,
    SchedulerService,
)
from pollux.service.storage.users import check_team_name

MAX_BODY_BYTES = 1 << 20
MAX_JSON_DEPTH = 32
MAX_INT_DIGITS = 4300
"""Longest JSON integer read (Python's default limit on int-from-text conversion)."""
"""Deepest nesting of arrays/objects a body may have (specs and hints need 3)."""
HINTS_PATH_SUFFIX = "/hints"


class ApiError(Exception):
    """An error response with a status code and the field it concerns."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field


def json_depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value (iterative: no recursion limit to hit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in
                         (item.values() if isinstance(item, dict) else item))
    return deepest


async def json_body(request: Request) -> Any:
    """The request's JSON body, read as a stream that stops at ``MAX_BODY_BYTES`` (413)
    so an endless or huge body never sits in memory; malformed or too deeply nested
    JSON is a 400."""
    too_large = ApiError(413, f"body larger than {MAX_BODY_BYTES} bytes", "body")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_large
        chunks.append(chunk)
    too_long: list[TooLongInteger] = []
    try:
        value = json.loads(b"".join(chunks), parse_int=lambda text: parse_int(text, too_long))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"body is not valid JSON: {exc}", "body") from exc
    except RecursionError as exc:
        raise ApiError(400, f"body nests deeper than {MAX_JSON_DEPTH} levels", "body") from exc
    if json_depth(value) > MAX_JSON_DEPTH:
        raise ApiError(400, f"body nests deeper than {MAX_JSON_DEPTH} levels", "body")
    if too_long:
        field = path_of(value, too_long[0]) or "body"
        raise ApiError(422, f"invalid {field}: an integer of {too_long[0].num_digits} digits "
                            f"is too long (at most {MAX_INT_DIGITS})", field)
    return value


class TooLongInteger:
    """Stands in for a JSON integer too long to convert (Python refuses over 4,300
    digits), so that the error can name the field it is in."""

    def __init__(self, num_digits: int) -> None:
        self.num_digits = num_digits


def parse_int(text: str, too_long: list[TooLongInteger]) -> int | TooLongInteger:
    num_digits = len(text.lstrip("-"))
    if num_digits <= MAX_INT_DIGITS:
        return int(text)
    marker = TooLongInteger(num_digits)
    too_long.append(marker)
    return marker


def path_of(value: Any, target: object) -> str | None:
    """The dotted path (list items by index) of ``target`` inside ``value``."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if item is target:
            return ".".join(path)
        if isinstance(item, dict):
            stack.extend((child, (*path, str(key))) for key, child in item.items())
        elif isinstance(item, list):
            stack.extend((child, (*path, str(index))) for index, child in enumerate(item))
    return None


def is_hints_post(request: Request) -> bool:
    """A job posting its hints (authenticated by the route with the job's own token)."""
    return request.method == "POST" and request.url.path.endswith(HINTS_PATH_SUFFIX)


def create_app(service: SchedulerService, auth: ApiAuth,
               hints_rate: RateLimiter | None = None,
               sessions: Sessions | None = None) -> FastAPI:
    """The API app; ``auth`` guards every route (see :mod:`pollux.service.http.auth`);
    ``hints_rate`` bounds how often each job may post hints (default
    ``RateLimit()``: 1 per second, bursts of 30); ``sessions``: the dashboard's
    sessions (default: new ones, see :mod:`pollux.service.http.sessions`)."""
    hints_limiter = hints_rate if hints_rate is not None else RateLimiter(RateLimit())
    app = FastAPI(title="Pollux scheduler", version=__version__,
                  description="Submit, watch and cancel elastic training jobs.",
                  docs_url=None, redoc_url=None)
    def hints_token_of(job_id: str) -> str | None:
        try:
            return service.job_for_hints(job_id).hints_token
        except UnknownJobError:
            return None

    install_guard(app, auth, exempt=is_hints_post, sessions=sessions,
                  hints_token_of=hints_token_of,
                  identities=Identities(service.users))

    if service.metrics is not None:
        request_duration = service.metrics.request_duration

        @app.middleware("http")
        async def time_request(request: Request, call_next: Any) -> Response:
            start = time.perf_counter()
            response: Response = await call_next(request)
            route = getattr(request.scope.get("route"), "path", "unmatched")
            request_duration.labels(request.method, route, str(response.status_code)
                                    ).observe(time.perf_counter() - start)
            return response

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.field)

    @app.exception_handler(ConfigError)
    async def on_config_error(request: Request, exc: ConfigError) -> JSONResponse:
        return error_response(422, str(exc), exc.field)

    @app.exception_handler(ForbiddenError)
    async def on_forbidden(request: Request, exc: ForbiddenError) -> JSONResponse:
        return error_response(403, exc.message, exc.field)

    @app.exception_handler(UnknownUserError)
    async def on_unknown_user(request: Request, exc: UnknownUserError) -> JSONResponse:
        return error_response(404, str(exc), "name")

    @app.exception_handler(UnknownJobError)
    async def on_unknown_job(request: Request, exc: UnknownJobError) -> JSONResponse:
        return error_response(404, str(exc), "job")

    @app.exception_handler(StoreUnavailableError)
    async def on_store_unavailable(request: Request, exc: StoreUnavailableError
                                   ) -> JSONResponse:
        if exc.full:  # 507 Insufficient Storage: the message names the data directory
            return error_response(507, str(exc), "data_dir")
        response = error_response(503, str(exc), None)
        response.headers["Retry-After"] = "1"
        return response

    @app.exception_handler(StoreDamagedError)
    async def on_store_damaged(request: Request, exc: StoreDamagedError) -> JSONResponse:
        # not 503: retrying cannot help; the message names the store and the fix
        return error_response(500, str(exc), "job" if exc.job_id else "data_dir")

    @app.exception_handler(UnknownPluginError)
    async def on_unknown_plugin(request: Request, exc: UnknownPluginError) -> JSONResponse:
        return error_response(422, str(exc), exc.kind)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        location = [str(part) for part in first.get("loc", ()) if part not in
                    ("query", "path", "body")]
        field = ".".join(location) or None
        return error_response(422, f"invalid {field}: {first.get('msg', 'bad value')}", field)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        field = "path" if exc.status_code in (404, 405) else None
        return error_response(exc.status_code, f"{exc.detail}: {request.method} "
                                               f"{request.url.path}", field)

    @app.get("/api/health")
    def health() -> dict[str, Any]:
        return {**service.health(), "version": __version__}

    @app.get("/api/nodes")
    def nodes() -> list[dict[str, Any]]:
        return service.nodes()

    @app.get("/api/cluster")
    def cluster() -> dict[str, Any]:
        return service.cluster()

    @app.get("/api/jobs", response_model=list[dict[str, Any]])
    def list_jobs(request: Request,
                  limit: int = Query(DEFAULT_FINISHED_LISTED, ge=0, le=MAX_LISTED),
                  offset: int = Query(0, ge=0, le=1 << 40)) -> Response:
        """Every job not finished, and the newest ``limit`` finished jobs after skipping
        the ``offset`` newest (page through older ones with ``offset``), in submission
        order. Of others' jobs a user sees the id, name, owner, team, state and GPUs."""
        jobs = service.list_jobs(limit, offset)
        principal = principal_of(request)
        if not principal.is_admin:
            jobs = [visible_summary(principal, job) for job in jobs]
        return JSONResponse(jobs)  # plain JSON: no re-encoding

    @app.post("/api/jobs", status_code=201, openapi_extra=SUBMIT_OPENAPI)
    async def submit(request: Request, team: str | None = Query(
            None, description="The team the job goes into (default: the submitter's "
                              "first team)")) -> dict[str, Any]:
        principal = principal_of(request)
        chosen = submit_team(principal, None if team is None else check_team_name(team),
                             service.team_names)
        body = await json_body(request)
        return await run_in_threadpool(service.submit, body, principal.name, chosen)

    @app.get("/api/jobs/{ref}")
    def describe(ref: str, request: Request,
                 events_limit: int = Query(DEFAULT_EVENTS_LISTED, ge=0, le=MAX_LISTED),
                 events_offset: int = Query(0, ge=0, le=1 << 40)) -> dict[str, Any]:
        """The job in detail, with its newest ``events_limit`` events after skipping the
        ``events_offset`` newest (oldest first); a user's own jobs only (a team admin:
        its teams'; an admin: all)."""
        record = authorize_job(service, request, ref, JobAction.READ)
        return service.describe(record.id, events_limit, events_offset)

    @app.post("/api/jobs/{ref}/cancel", status_code=202)
    def cancel(ref: str, request: Request) -> dict[str, Any]:
        """Cancel the job (its owner, an admin of its team, or an admin)."""
        record = authorize_job(service, request, ref, JobAction.CANCEL)
        return service.cancel(record.id)

    @app.post("/api/jobs/{job_id}/hints", status_code=204)
    async def post_hints(job_id: str, request: Request) -> Response:
        given = bearer_token(request)
        if given is None:
            raise ApiError(401, "send the job's hints token: 'Authorization: Bearer "
                                "<token>'", "Authorization")
        if not auth.accepts_token(given):
            # a job token: the same answer whether or not the job exists (no enumeration)
            try:
                allowed = tokens_match(given, service.job_for_hints(job_id).hints_token)
            except UnknownJobError:
                allowed = False
            if not allowed:
                raise ApiError(403, f"this token may not post hints for job {job_id}",
                               "Authorization")
        wait_s = hints_limiter.take(job_id)
        if wait_s > 0:
            response = error_response(
                429, f"job {job_id} posts hints too often (at most {hints_limiter.limit.per_s:g}"
                     f" per second, bursts of {hints_limiter.limit.burst}); retry in "
                     f"{wait_s:.1f} s", "hints")
            response.headers["Retry-After"] = str(max(1, math.ceil(wait_s)))
            return response
        body = await json_body(request)
        await run_in_threadpool(service.post_hints, job_id, body)
        return Response(status_code=204)

    @app.get("/api/jobs/{ref}/logs")
    def logs(ref: str, request: Request, replica: int = Query(0, ge=0, le=100000),
             offset: int = Query(0, ge=-(1 << 40), le=1 << 40),
             limit: int = Query(65536, ge=1, le=1 << 20),
             rotated: bool = Query(False)) -> dict[str, Any]:
        """A replica's log (``rotated``: its older part, ``replica-<r>.log.1``): a user's
        own jobs only (a team admin: its teams'; an admin: all)."""
        record = authorize_job(service, request, ref, JobAction.READ)
        return service.read_log(record.id, replica, offset, limit, rotated)

    add_user_routes(app, service, json_body)
    add_dashboard(app, service)
    add_offline_docs(app)
    add_schemas(app)
    return app
