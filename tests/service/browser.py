"""Headless Chromium for browser tests: Debian's ``chromium`` and ``chromium-driver``
driven by Selenium (no browser download). Tests skip with the reason when either is
missing; CI installs both (``.ci/run``)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM_NAMES = ("chromium", "chromium-browser")
WINDOW = (1400, 1000)


def find_chromium() -> tuple[str, str] | None:
    """(browser, driver) executables, or None."""
    browser = next(filter(None, map(shutil.which, CHROMIUM_NAMES)), None)
    driver = shutil.which("chromedriver")
    return None if browser is None or driver is None else (browser, driver)


def skip_reason() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "browser tests need selenium (pip install -e '.[dev]')"
    if find_chromium() is None:
        return ("browser tests need Chromium and its driver: apt-get install chromium "
                "chromium-driver")
    return None


@contextmanager
def headless_chromium(offline: bool = False) -> Iterator[Any]:
    """A Selenium driver of a fresh headless Chromium profile. ``offline``: every
    request beyond loopback goes to a dead proxy, so any external load fails."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    found = find_chromium()
    assert found is not None, skip_reason()
    browser, driver_path = found
    profile = tempfile.mkdtemp(prefix="pollux-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}",
                 f"--window-size={WINDOW[0]},{WINDOW[1]}"):
        options.add_argument(flag)
    if offline:  # loopback bypasses a proxy by default; nothing else gets through
        options.add_argument("--proxy-server=http://127.0.0.1:9")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    try:
        driver.set_page_load_timeout(60)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def pixel_spread(png: bytes) -> tuple[float, int]:
    """(standard deviation of the grey levels, number of distinct colours) of a PNG."""
    import io

    import numpy as np
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    pixels = np.asarray(image)
    colours = len(np.unique(pixels.reshape(-1, 3), axis=0))
    return float(pixels.mean(axis=2).std()), colours


def save(png: bytes, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png)
    return path


skip_without_chromium = pytest.mark.skipif(skip_reason() is not None,
                                           reason=skip_reason() or "")
