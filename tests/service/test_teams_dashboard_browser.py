"""Issue 32, the dashboard's team views in a real browser (headless Chromium) against a
live ``pollux server --teams FILE`` (local backend, 2 virtual nodes x 2 slots,
``quota-tiresias``) with two registered users: ann (team a) and bo (team b). Ann's
session shows the teams table (quota, in use, lent, borrowed, pending) as bo's jobs borrow
a's idle quota and as ann's job reclaims it, every job's owner and team, and of bo's job
only what every user sees: not its log, events, environment or charts."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest

from tests.service.browser import headless_chromium, skip_without_chromium
from tests.service.e2e_helpers import REPO, ServerProcess, wait_until
from tests.service.test_dashboard_browser import cell

pytestmark = [skip_without_chromium, pytest.mark.timeout(120)]

FAKE_JOB = str(REPO / "tests" / "backends" / "fake_job.py")
TEAMS = "teams:\n  a: {quota_gpus: 2, weight: 1}\n  b: {quota_gpus: 2, weight: 1}\n"
BO_SECRET = "bo-secret-7f3a"
"""In bo's job's environment and log: nothing of ann's session may show it."""


def job_spec(name: str, marker: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Two replicas that print ``marker`` and then step until stopped."""
    return {"name": name, "working_dir": str(REPO), "env": env or {},
            "command": ["/bin/sh", "-c", f"echo {marker}; exec {sys.executable} {FAKE_JOB} "
                                         "--steps 72000 --step-s 0.05"],
            "min_replicas": 2, "max_replicas": 2, "max_failures": 0}


@pytest.fixture
def server(tmp_path: Path):
    teams = tmp_path / "teams.yaml"
    teams.write_text(TEAMS)
    process = ServerProcess(tmp_path / "data", policy="quota-tiresias", interval_s=0.5,
                            extra_args=("--teams", str(teams)))
    yield process
    process.cleanup()


def teams_row(driver: Any, team: str) -> dict[str, str] | None:
    """The cells of one row of the page's teams table, by column, or None."""
    return driver.execute_script(
        "const row = document.querySelector(`#teams-table tr[data-team='${arguments[0]}']`);"
        "return row ? Object.fromEntries([...row.querySelectorAll('td')].map("
        "c => [c.dataset.col, c.textContent])) : null;", team)


def click_row(driver: Any, job_id: str) -> None:
    """Click the job's row in one script (the page redraws its rows every refresh, so
    an element found first may be gone when clicked)."""
    driver.execute_script("document.querySelector(`#jobs-table tr[data-job="
                          "'${arguments[0]}']`).click();", job_id)


def test_a_users_dashboard_shows_the_teams_and_only_its_own_jobs_details(server):
    admin = server.start()
    url = admin.address.url
    tokens = {name: admin.add_user(name, [team])["token"] for name, team in (("ann", "a"),
                                                                            ("bo", "b"))}

    def submit(user: str, spec: dict[str, Any]) -> str:
        response = httpx.post(f"{url}/api/jobs", json=spec,
                              headers={"Authorization": f"Bearer {tokens[user]}"})
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    b1 = submit("bo", job_spec("b1", BO_SECRET, {"BO_TOKEN": BO_SECRET}))
    b2 = submit("bo", job_spec("b2", BO_SECRET))
    with headless_chromium() as driver:
        driver.get(f"{url}/?{urlencode({'token': tokens['ann'], 'refresh_s': '0.5'})}")
        wait_until(lambda: driver.find_element("id", "whoami").text == "signed in as ann",
                   30, "ann's session")
        # a is idle: b runs on all 4 GPUs, 2 of them lent by a
        wait_until(lambda: teams_row(driver, "b") == {
            "team": "b", "quota": "2", "in_use": "4", "lent": "0", "borrowed": "2",
            "pending": "0", "jobs": "2"}, 30, f"b borrowing: {teams_row(driver, 'b')}")
        assert teams_row(driver, "a") == {"team": "a", "quota": "2", "in_use": "0",
                                          "lent": "2", "borrowed": "0", "pending": "0",
                                          "jobs": "0"}
        a1 = submit("ann", {**job_spec("a1", "ann-was-here"), "priority": 3})
        wait_until(lambda: teams_row(driver, "a") == {
            "team": "a", "quota": "2", "in_use": "2", "lent": "0", "borrowed": "0",
            "pending": "0", "jobs": "1"}, 30, f"a's quota reclaimed: {teams_row(driver, 'a')}")
        assert teams_row(driver, "b") == {"team": "b", "quota": "2", "in_use": "2", "lent": "0",
                                          "borrowed": "0", "pending": "2", "jobs": "2"}
        for job, owner, team in ((a1, "ann", "a"), (b1, "bo", "b"), (b2, "bo", "b")):
            assert (cell(driver, job, "owner"), cell(driver, job, "team")) == (owner, team)

        # ann's own job: its log, events and charts
        click_row(driver, a1)
        wait_until(lambda: "ann-was-here" in driver.find_element("id", "job-log").text, 30,
                   "ann's job's log")
        assert "priority 3" in driver.find_element("id", "job-reason").text
        wait_until(lambda: driver.execute_script(
            "return document.querySelectorAll('#job-events li').length") > 0, 10,
            "ann's job's events")
        # bo's job: who owns it, and nothing of what only bo may read
        running = next(j for j in (b1, b2) if cell(driver, j, "state") == "Running")
        click_row(driver, running)
        wait_until(lambda: driver.find_element("id", "job-private").is_displayed(), 10,
                   "the private note")
        assert driver.find_element("id", "job-title").text == running
        assert "owned by bo (team b)" in driver.find_element("id", "job-private").text
        assert driver.find_element("id", "job-log").text == ""
        assert driver.execute_script(
            "return document.querySelectorAll('#job-events li').length") == 0
        assert not driver.execute_script(  # ann's job's charts are not drawn under bo's
            "return document.querySelectorAll('#job-detail path.line').length")
        assert not driver.find_element("id", "job-cancel").is_displayed()
        assert BO_SECRET not in driver.page_source
        # the session itself cannot read bo's job, whatever the page shows
        statuses = driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "const headers = {'X-CSRF-Token': sessionStorage.getItem('pollux-csrf')};"
            "Promise.all(['', '/logs', '/history', '/cancel'].map((path, i) => fetch("
            "`/api/jobs/${arguments[0]}${path}`, {headers, method: i === 3 ? 'POST' : 'GET',"
            " credentials: 'same-origin'}).then(r => r.status))).then(done);", running)
        assert statuses == [403, 403, 403, 403], statuses
        own = driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch(`/api/jobs/${arguments[0]}`, {headers: {'X-CSRF-Token': "
            "sessionStorage.getItem('pollux-csrf')}}).then(r => r.status).then(done);", a1)
        assert own == 200  # the same session reads ann's own job
        # bo's job opened by its name (a link, not a row of the list): the page says the
        # rule that refused it, not that the session ended
        driver.get(f"{url}/?job=b1")
        wait_until(lambda: driver.execute_script(
            "const e = document.getElementById('error'); return e && !e.hidden ? "
            "e.textContent : ''").startswith("not allowed: 403"), 20, "the refusal")
        assert "may not read the logs" in driver.find_element("id", "error").text
    assert admin.job(running)["state"] == "Running"  # the refused cancel did nothing
