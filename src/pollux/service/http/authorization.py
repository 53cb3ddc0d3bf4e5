"""Who may do what to which job, once the guard knows who is asking.

Identities (:class:`Principal`):

* the **server's own account**: a request with the server token, or over the local
  socket from the server's Unix user. It may do everything, and it alone manages users
  (``pollux user ...``);
* a **registered user** (:mod:`pollux.service.storage.users`), known by its user token, by its
  Unix account over the local socket, or by the dashboard session it opened.

The rules, applied by the API before it answers:

1. everyone sees every job's id, name, owner, team, state and GPUs (as ``squeue`` shows
   every job), and the nodes, the cluster and the teams;
2. a job's logs, environment, spec, hints and events are shown to its owner only; a
   team admin sees those of its teams' jobs, an admin those of every job;
3. a job is cancelled by its owner, an admin of its team, or an admin;
4. a job is submitted into one of its submitter's teams (the first, unless it names
   another); an admin may name any team;
5. users are added, removed and given new tokens by the server's own account only.

Without registered users the server token is the only identity: everything is as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from pollux.errors import ForbiddenError
from pollux.service.storage.users import UserRecord

__all__ = ["SERVER_ACCOUNT", "JobAction", "Principal", "check_job_action", "may_act",
           "submit_team"]


class JobAction(Enum):
    """What a request does to one job; the value reads in a refusal."""

    READ = "read the logs, environment, spec and events of"
    CANCEL = "cancel"


@dataclass(frozen=True)
class Principal:
    """Who a request acts as."""

    user: UserRecord | None
    """The registered user; None: the server's own account."""

    @property
    def name(self) -> str | None:
        return None if self.user is None else self.user.name

    @property
    def is_server(self) -> bool:
        return self.user is None

    @property
    def is_admin(self) -> bool:
        return self.user is None or self.user.admin

    def describe(self) -> str:
        return "the server's account" if self.user is None else f"user {self.user.name!r}"


SERVER_ACCOUNT = Principal(None)


def may_act(principal: Principal, owner: str | None, team: str | None) -> bool:
    """Whether ``principal`` may read and cancel a job of ``owner`` in ``team`` (rules
    2 and 3)."""
    user = principal.user
    if user is None or user.admin:
        return True
    if owner is not None and owner == user.name:
        return True
    return user.team_admin and team is not None and team in user.teams


def check_job_action(principal: Principal, action: JobAction, job_id: str,
                     owner: str | None, team: str | None) -> None:
    """Raise :class:`~pollux.errors.ForbiddenError` naming the rule unless
    ``principal`` may ``action`` the job."""
    if may_act(principal, owner, team):
        return
    whose = "the server's account" if owner is None else f"user {owner!r}"
    raise ForbiddenError(
        f"{principal.describe()} may not {action.value} job {job_id} (owned by {whose}, "
        f"team {team or '(none)'}): a user may {action.value} their own jobs only; a team "
        "admin those of their teams, an admin every job", "owner")


def submit_team(principal: Principal, requested: str | None,
                known_teams: tuple[str, ...] | None = None) -> str | None:
    """The team a submission of ``principal`` goes into (rule 4): ``requested`` if it
    may use it, else the user's first team; the server's account may name any team (or
    none). ``known_teams``: the teams file's names, when one is given."""
    user = principal.user
    if requested is not None and known_teams is not None and requested not in known_teams:
        raise ForbiddenError(f"team {requested!r} is not in the server's teams file "
                             f"(teams: {', '.join(known_teams) or '(none)'})", "team")
    if user is None:
        return requested
    if requested is None:
        return user.teams[0]
    if requested in user.teams or user.admin:
        return requested
    raise ForbiddenError(f"{principal.describe()} may not submit into team {requested!r}: a "
                         "job goes into one of its submitter's teams "
                         f"({', '.join(user.teams)}); an admin may name any team", "team")
