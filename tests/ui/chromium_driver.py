"""Headless Chromium driven by Selenium through Debian's chromium-driver.

Selenium's own driver download (Selenium Manager) cannot work without the network, so the
driver and browser are the Debian binaries at fixed paths; without them the browser tests skip,
saying which binary is missing. The flags keep Chromium from reaching out to the network
(component updates, sync, QUIC probes) and from touching a real profile.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
)


def require_browser() -> None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        pytest.skip(
            f"browser test needs Debian's chromium and chromium-driver; missing {missing} "
            "(apt-get install chromium chromium-driver, as `make test` does)"
        )


def chromium(profile: Path) -> WebDriver:
    """A fresh headless Chromium with its own profile folder (removed first if present)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    shutil.rmtree(profile, ignore_errors=True)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    service = Service(executable_path=CHROMEDRIVER, log_output=str(profile) + ".driver.log")
    return webdriver.Chrome(service=service, options=options)
