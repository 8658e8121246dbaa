"""The explorer app in a real browser: `python app.py` on a free port, and headless Chromium.

Shared by the browser test (tests/test_app_e2e.py) and the app timing (`python -m benchmarks app`).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from sbon.errors import SBoNError

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# The flags the environment's probe started Chromium with: no sandbox (containers), no GPU, no network chatter.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AppURL(str):
    """The app's URL, with its server's process id and log file."""
    pid: int
    log: Path


@contextmanager
def serve_app(log: Path, start_timeout_s: float = 120, env: dict[str, str] | None = None,
              args: tuple[str, ...] = ("app.py",)) -> Iterator[AppURL]:
    """Start `python app.py` in a fresh process, yield its URL once it answers, stop it afterwards.
    Its output goes to ``log``; a server that does not start raises SBoNError with the log's tail.
    ``env`` adds to the environment (e.g. SBON_CACHE for a fresh machine's empty cache); ``args``
    replace `app.py` (e.g. a script that hides packages first)."""
    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
           "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1", **(env or {})}
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = AppURL(f"http://127.0.0.1:{port}/")
    url.pid, url.log = proc.pid, log
    try:
        deadline = time.time() + start_timeout_s
        while True:
            try:
                urllib.request.urlopen(url, timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise SBoNError(f"the app did not start:\n{log.read_text()[-3000:]}") from None
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def chromium():
    """A headless Chromium browser from Playwright (``pip install playwright``) and Debian's chromium."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise SBoNError("playwright is not installed: pip install -r requirements-dev.txt") from None
    if not Path(CHROMIUM).exists():
        raise SBoNError(f"chromium is not installed at {CHROMIUM} (apt-get install chromium, or set $CHROMIUM)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def open_tab(page, name: str) -> None:
    """Click the page's tab called ``name``; on a narrow screen Gradio folds the last tabs into an
    overflow menu, which is opened first."""
    tab = page.get_by_role("tab", name=name)
    if tab.count() and tab.first.is_visible():
        tab.first.click()
        return
    page.get_by_label("More tabs").click()
    # The opened menu lies under the tab bar in the stacking order: click its item directly.
    page.locator(".overflow-menu button, .overflow-dropdown button", has_text=name).first.dispatch_event("click")
