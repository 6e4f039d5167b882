"""The real app, launched as a server process on a free localhost port, with the Hub offline; and the headless
Chromium its browser tests drive (Debian's package: a browser is never downloaded)."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = Path(os.environ.get("VITVIZ_SCREENSHOTS", "/tmp/vitviz-screenshots"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class AppServer:
    process: subprocess.Popen
    url: str
    log: Path

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()


def launch(tmp: Path, *args: str, env: dict | None = None, timeout: float = 180,
           script: Path = ROOT / "app.py") -> AppServer:
    """`python app.py ARGS` (or another `script` that runs it) on a free port; returns once the page is served
    (or raises with the log), within 0.05 s of it: the cold-start benchmark times the first page by this return.
    `env` adds to or overrides the environment; a None value removes that variable (HF_HUB_OFFLINE: None
    lets the app reach the Hub that HF_ENDPOINT names)."""
    port = free_port()
    log = tmp / f"app-{port}.log"
    environ = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
               "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp / "hf-home"), "GRADIO_TEMP_DIR": str(tmp / "gradio"),
               "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1", **(env or {})}
    environ = {name: value for name, value in environ.items() if value is not None}
    process = subprocess.Popen([sys.executable, str(script), *args], cwd=ROOT, env=environ,
                               stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the app exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return AppServer(process, url, log)
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"the app did not serve {url} within {timeout} s:\n{log.read_text()[-3000:]}")


def launch_browser(playwright):
    """Headless Chromium from `sync_playwright()`; a test without it is skipped (in CI, where .ci/run installs it,
    it fails)."""
    import pytest

    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium package")
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)")
    return playwright.chromium.launch(executable_path=CHROMIUM, args=[
        "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"])


@contextlib.contextmanager
def explained_page(url: str, photo: Path, *, width: int = 1400) -> Iterator:
    """A page of the app at `url`, `width` px wide (below 600 px a phone's 844 px tall, else 1000), with `photo`
    uploaded and explained: yields it once the comparison line is shown. Screenshots go to SCREENSHOTS."""
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = launch_browser(p)
        page = browser.new_page(viewport={"width": width, "height": 1000 if width > 600 else 844})
        page.goto(url)
        page.locator("#input-image input[type=file]").set_input_files(str(photo))
        page.locator("#input-image img").first.wait_for(timeout=30_000)
        page.locator("#explain").click()
        page.locator("#comparison").get_by_text("rank correlation").first.wait_for(timeout=120_000)
        yield page
        browser.close()
