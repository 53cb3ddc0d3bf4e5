"""The API's routes for users (``/api/users``, the server's own account only) and what
each request may see of a job (:mod:`pollux.service.http.authorization` has the rules)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool

from pollux.errors import ConfigError, ForbiddenError
from pollux.service.http.authorization import JobAction, Principal, check_job_action, may_act
from pollux.service.http.local_socket import share_local_socket
from pollux.service.server import SchedulerService
from pollux.service.storage.records import JobRecord
from pollux.service.storage.users import check_user_name

__all__ = ["SHARED_JOB_FIELDS", "add_user_routes", "authorize_job", "principal_of",
           "visible_summary"]

SHARED_JOB_FIELDS = frozenset({
    "id", "name", "owner", "team", "state", "recovering", "replicas", "nodes",
    "allocation", "gpu_type", "cancel_requested", "submitted_at", "started_at",
    "finished_at", "age_s", "run_time_s", "restarts", "failures", "rescales"})
"""What every user sees of every job (as ``squeue`` shows); the rest of a summary (its
reason, batch size, goodput: read from its logs and hints) is null for others' jobs."""


def principal_of(request: Request) -> Principal:
    """Who the guard found the request comes from (it sets it on every guarded route)."""
    principal = getattr(request.state, "principal", None)
    if not isinstance(principal, Principal):  # an exempt route: no identity to act as
        raise ForbiddenError("this route needs the server's or a user's token", "Authorization")
    return principal


def visible_summary(principal: Principal, summary: Mapping[str, Any]) -> dict[str, Any]:
    """``summary`` as ``principal`` may see it (everything of a job it may act on)."""
    if may_act(principal, summary.get("owner"), summary.get("team")):
        return dict(summary)
    return {key: (value if key in SHARED_JOB_FIELDS else None)
            for key, value in summary.items()}


def authorize_job(service: SchedulerService, request: Request, ref: str,
                  action: JobAction) -> JobRecord:
    """The job ``ref``, once the request's identity may ``action`` it (403 otherwise)."""
    record = service.store.find_job(ref)
    check_job_action(principal_of(request), action, record.id, record.owner, record.team)
    return record


def _server_account_only(request: Request, what: str) -> None:
    principal = principal_of(request)
    if not principal.is_server:
        raise ForbiddenError(f"{principal.describe()} may not {what}: users are managed by "
                             "the server's own account (its token, or its Unix user on the "
                             "server's machine)", "Authorization")


def _teams_of(body: Mapping[str, Any]) -> list[str]:
    teams = body.get("teams")
    if not isinstance(teams, list) or not all(isinstance(team, str) for team in teams):
        raise ConfigError("teams", teams, "a list of team names: --team T (repeatable)")
    return teams


def _flag(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise ConfigError(name, value, "true or false")
    return value


def add_user_routes(app: FastAPI, service: SchedulerService,
                    json_body: Callable[[Request], Awaitable[Any]]) -> None:
    """Mount ``/api/whoami``, ``/api/teams`` and ``/api/users`` (list, add, remove,
    rotate a token) on ``app``; ``json_body``: reads a request's body, bounded (the
    API's)."""
    users = service.users

    def shared_after_change() -> None:
        share_local_socket(service.data_dir, users.count() > 0)

    @app.get("/api/whoami", tags=["users"])
    def whoami(request: Request) -> dict[str, Any]:
        """Who the server takes this request for: a registered user (name, teams,
        roles), or the server's own account (``name`` null)."""
        principal = principal_of(request)
        if principal.user is None:
            return {"name": None, "teams": [], "team_admin": False, "admin": True,
                    "server_account": True}
        return {**principal.user.to_dict(), "server_account": False}

    @app.get("/api/teams", tags=["users"])
    def teams() -> dict[str, Any]:
        """Each team's quota, GPUs in use, lent, borrowed and pending, and its active
        jobs (:mod:`pollux.service.http.team_usage`); every identity may read it."""
        return {"teams": service.team_usage(), "teams_file": service.teams is not None}

    @app.get("/api/users", tags=["users"])
    def list_users(request: Request) -> list[dict[str, Any]]:
        """The registered users (names, teams, roles; never a token)."""
        _server_account_only(request, "list users")
        return [user.to_dict() for user in users.list()]

    @app.post("/api/users", status_code=201, tags=["users"])
    async def add_user(request: Request) -> dict[str, Any]:
        """Register a user: ``{"name", "teams": [...], "team_admin", "admin"}``; the
        answer carries its token, shown this once (only its hash is stored)."""
        _server_account_only(request, "add users")
        body = await json_body(request)
        if not isinstance(body, dict):
            raise ConfigError("body", type(body).__name__, "a JSON object")
        unknown = set(body) - {"name", "teams", "team_admin", "admin"}
        if unknown:
            raise ConfigError(sorted(unknown)[0], body[sorted(unknown)[0]], "unknown field; "
                              "give name, teams, team_admin, admin")
        name = check_user_name(body.get("name"))
        teams = _teams_of(body)
        known = service.team_names
        for team in teams:
            if known is not None and team not in known:
                raise ConfigError("team", team, f"not a team of the server's teams file "
                                                f"(teams: {', '.join(known)})")

        def add() -> dict[str, Any]:
            user, token = users.add(name, teams, service.clock(), _flag(body, "team_admin"),
                                    _flag(body, "admin"))
            shared_after_change()
            return {**user.to_dict(), "token": token}
        return await run_in_threadpool(add)

    @app.delete("/api/users/{name}", tags=["users"])
    def remove_user(name: str, request: Request) -> dict[str, Any]:
        """Unregister a user: its token and dashboard sessions stop working; its jobs
        keep running and keep their owner."""
        _server_account_only(request, "remove users")
        users.remove(name)
        shared_after_change()
        return {"name": name, "removed": True}

    @app.post("/api/users/{name}/token", tags=["users"])
    def rotate_token(name: str, request: Request) -> dict[str, Any]:
        """A new token for the user (shown this once); the old one stops working."""
        _server_account_only(request, "give users new tokens")
        return {"name": name, "token": users.rotate(name, service.clock())}
