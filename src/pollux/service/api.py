"""The REST API (FastAPI). Thin: parses, checks tokens, calls the service, formats.

Errors are JSON ``{"detail": message, "field": name}``: 400 malformed body, 401 missing
or wrong token, 403 a job token used for another job, 404 unknown job, 413 body too
large, 422 a field with a bad value (the field is named).

Every request needs ``Authorization: Bearer <token>`` when the server has a token. The
hints endpoint instead takes the job's own hints token (or the server token).
"""

from __future__ import annotations

import hmac
import json
import time
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from pollux import __version__
from pollux.errors import ConfigError, UnknownPluginError
from pollux.service.dashboard import add_dashboard
from pollux.service.openapi import SUBMIT_OPENAPI, add_offline_docs, add_schemas
from pollux.service.server import SchedulerService
from pollux.service.store import UnknownJobError

MAX_BODY_BYTES = 1 << 20
HINTS_PATH_SUFFIX = "/hints"


class ApiError(Exception):
    """An error response with a status code and the field it concerns."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field


def error_response(status: int, message: str, field: str | None = None) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"detail": message, "field": field}, status_code=status,
                        headers=headers)


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def tokens_match(given: str | None, expected: str | None) -> bool:
    if given is None or expected is None:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


async def json_body(request: Request) -> Any:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise ApiError(413, f"body larger than {MAX_BODY_BYTES} bytes", "body")
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise ApiError(413, f"body larger than {MAX_BODY_BYTES} bytes", "body")
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"body is not valid JSON: {exc}", "body") from exc


def create_app(service: SchedulerService, token: str | None = None) -> FastAPI:
    app = FastAPI(title="Pollux scheduler", version=__version__,
                  description="Submit, watch and cancel elastic training jobs.",
                  docs_url=None, redoc_url=None)

    @app.middleware("http")
    async def check_token(request: Request, call_next: Any) -> Response:
        is_hints = request.method == "POST" and request.url.path.endswith(HINTS_PATH_SUFFIX)
        if token is not None and not is_hints and not tokens_match(bearer_token(request),
                                                                   token):
            return error_response(401, "missing or wrong token: send 'Authorization: "
                                       "Bearer <token>'", "Authorization")
        response: Response = await call_next(request)
        return response

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

    @app.exception_handler(UnknownJobError)
    async def on_unknown_job(request: Request, exc: UnknownJobError) -> JSONResponse:
        return error_response(404, str(exc), "job")

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

    @app.get("/api/jobs")
    def list_jobs() -> list[dict[str, Any]]:
        return service.list_jobs()

    @app.post("/api/jobs", status_code=201, openapi_extra=SUBMIT_OPENAPI)
    async def submit(request: Request) -> dict[str, Any]:
        return service.submit(await json_body(request))

    @app.get("/api/jobs/{ref}")
    def describe(ref: str) -> dict[str, Any]:
        return service.describe(ref)

    @app.post("/api/jobs/{ref}/cancel", status_code=202)
    def cancel(ref: str) -> dict[str, Any]:
        return service.cancel(ref)

    @app.post("/api/jobs/{job_id}/hints", status_code=204)
    async def post_hints(job_id: str, request: Request) -> Response:
        given = bearer_token(request)
        record = service.job_for_hints(job_id)
        if not (tokens_match(given, record.hints_token) or tokens_match(given, token)):
            status = 401 if given is None else 403
            raise ApiError(status, f"this token may not post hints for job {job_id}",
                           "Authorization")
        service.post_hints(job_id, await json_body(request))
        return Response(status_code=204)

    @app.get("/api/jobs/{ref}/logs")
    def logs(ref: str, replica: int = Query(0, ge=0, le=100000),
             offset: int = Query(0, ge=-(1 << 40), le=1 << 40),
             limit: int = Query(65536, ge=1, le=1 << 20)) -> dict[str, Any]:
        return service.read_log(ref, replica, offset, limit)

    add_dashboard(app, service)
    add_offline_docs(app)
    add_schemas(app)
    return app
