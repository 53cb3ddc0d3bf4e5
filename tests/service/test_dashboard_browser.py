"""The dashboard in a real browser (headless Chromium) against a live ``pollux server``
running the digits example on 2 virtual nodes x 2 CPU slots: a submitted job appears, its
replicas change and it finishes, all without a page reload; ``/docs`` renders with the
network cut.

Set ``POLLUX_SCREENSHOT_DIR`` to keep the screenshot (README's docs/dashboard.png is one).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest

from tests.service.browser import headless_chromium, pixel_spread, save, skip_without_chromium
from tests.service.e2e_helpers import EXAMPLE, ServerProcess, example_spec, wait_until

pytestmark = [
    skip_without_chromium,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not EXAMPLE.exists(), reason="needs examples/train_digits.py"),
]

NO_RELOAD = "window.__pollux_no_reload === 'still here'"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    process = ServerProcess(tmp_path_factory.mktemp("dash") / "data")
    process.start()
    yield process
    process.cleanup()


def page_url(client, path: str, **query: str) -> str:
    """``path`` on the server; with its token as a ``?token=`` link when it has one (the
    server then sets the browser's cookie and redirects to the page without it)."""
    if client.address.token:
        query["token"] = client.address.token
    return client.address.url + path + ("?" + urlencode(query) if query else "")


def cell(driver, job_id: str, column: str) -> str | None:
    """Text of one cell of the page's jobs table, or None while the row is absent."""
    return driver.execute_script(
        "const c = document.querySelector(`#jobs-table tr[data-job='${arguments[0]}'] "
        "td[data-col='${arguments[1]}']`); return c ? c.textContent : null;", job_id, column)


def click_row(driver, job_id: str) -> None:
    """Click the job's row of the jobs table: a real click, again when the table was
    redrawn between finding the row and clicking it (it is redrawn every refresh)."""
    from selenium.common.exceptions import StaleElementReferenceException

    def clicked() -> bool:
        try:
            driver.find_element("css selector", f"#jobs-table tr[data-job='{job_id}']").click()
        except StaleElementReferenceException:
            return False
        return True

    wait_until(clicked, 20, f"a click on {job_id}'s row", interval_s=0.05)


def test_dashboard_follows_a_job_live(server, tmp_path):
    client = server.clients[-1]
    with headless_chromium() as driver:
        driver.get(page_url(client, "/", refresh_s="0.5"))
        wait_until(lambda: driver.execute_script(
            "return Number(document.getElementById('updated').dataset.refreshes) > 0"),
            30, "the dashboard's first refresh")
        driver.execute_script("window.__pollux_no_reload = 'still here'")
        assert driver.execute_script("return document.querySelectorAll('.slot').length") == 4

        # j1 ends before j2 (on 2 replicas each after the resize), so that j1 is not
        # relaunched on 3 replicas for its last epochs
        j1 = client.submit(example_spec("j1", 3, epochs=4))["id"]
        wait_until(lambda: cell(driver, j1, "state") is not None, 20, "j1 to appear")
        wait_until(lambda: cell(driver, j1, "replicas") == "3", 90, "j1 on 3 replicas")
        click_row(driver, j1)
        wait_until(lambda: driver.execute_script(
            "return document.getElementById('job-detail').dataset.job") == j1, 20,
            "j1's timeline to open")
        j2 = client.submit(example_spec("j2", 2, epochs=5))["id"]
        # equal shares: j1 is resized 3 -> 2 and j2 gets 2
        wait_until(lambda: cell(driver, j1, "replicas") == "2", 90, "j1 resized to 2")
        wait_until(lambda: cell(driver, j2, "state") == "Running", 90, "j2 running")
        wait_until(lambda: "samples/s" in (cell(driver, j1, "goodput") or ""), 60,
                   "j1's goodput")
        time.sleep(2)  # a few more samples on the charts
        png = driver.get_screenshot_as_png()
        keep = os.environ.get("POLLUX_SCREENSHOT_DIR")
        save(png, (Path(keep) if keep else tmp_path) / "dashboard.png")

        wait_until(lambda: cell(driver, j1, "state") == "Succeeded", 150, "j1 to finish")
        wait_until(lambda: cell(driver, j2, "state") == "Succeeded", 60, "j2 to finish")
        assert driver.execute_script(f"return {NO_RELOAD}"), "the page was reloaded"
        events = wait_until(lambda: driver.execute_script(
            "const kinds = [...document.querySelectorAll('#job-events li')]"
            ".map(e => e.dataset.kind); return kinds.includes('Succeeded') && kinds"),
            10, "j1's timeline to show its end")
        assert "Rescaling" in events and "Starting" in events, events
        replica_path = driver.execute_script(
            "const p = document.querySelector('#chart-replicas path.line');"
            "return p ? p.getAttribute('d') : ''")
        assert replica_path.count("V") >= 2, replica_path  # 0 -> 3 -> 2 steps
        assert "epoch" in driver.find_element("id", "job-log").text
        assert int(cell(driver, j1, "restarts")) >= 1
        log = driver.get_log("browser") if hasattr(driver, "get_log") else []
        assert not [e for e in log if e.get("level") == "SEVERE"], log

    spread, colours = pixel_spread(png)
    assert spread > 10 and colours > 50, (spread, colours)


def test_docs_render_with_the_network_cut(server):
    client = server.clients[-1]
    url = client.address.url
    with headless_chromium(offline=True) as driver:
        driver.get(page_url(client, "/docs"))
        wait_until(lambda: driver.execute_script(
            "return document.querySelectorAll('.opblock').length"), 30,
            "Swagger UI to list the operations")
        text = driver.find_element("css selector", ".swagger-ui").text
        assert "/api/jobs" in text and "Pollux scheduler" in text
        resources = driver.execute_script(
            "return performance.getEntriesByType('resource').map(r => r.name)")
        assert resources and all(r.startswith(url) for r in resources), resources


def test_a_typed_cluster_shows_its_gpu_type_speeds(tmp_path):
    """Declared speeds are in use from the start; the header says which, slowest first."""
    process = ServerProcess(tmp_path / "data", virtual_nodes="a:1x2,b:1x2",
                            extra_args=("--gpu-type-speeds", "b=2.5,a=1"))
    try:
        client = process.start()
        with headless_chromium() as driver:
            driver.get(page_url(client, "/", refresh_s="0.5"))
            text = wait_until(lambda: "GPU type speeds" in (
                driver.find_element("id", "health").text or "") and
                driver.find_element("id", "health").text, 30, "the speeds in the header")
            assert "GPU type speeds a 1, b 2.5" in text, text
    finally:
        process.cleanup()
