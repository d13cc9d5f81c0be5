"""Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe: nothing listens on a
port): open a page, record every request the page makes, evaluate expressions in it, take a screenshot.
Debian's `chromium` package; .ci/run installs it."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class DevTools:
    """One browser process; commands go to its fd 3 and replies come from its fd 4, NUL-terminated JSON."""

    def __init__(self, profile: Path):
        to_browser_read, self._write = os.pipe()
        self._read, from_browser_write = os.pipe()

        def on_fds_3_and_4():  # in the child, before exec; by way of free high numbers so neither clobbers the other
            os.dup2(to_browser_read, 100)
            os.dup2(from_browser_write, 101)
            os.dup2(100, 3)
            os.dup2(101, 4)

        self._process = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             "--disable-background-networking", "--no-first-run", f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=False, preexec_fn=on_fds_3_and_4,
        )
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._next_id, self._buffer, self.events = 0, b"", []

    def _message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("no reply from chromium")
            chunk = os.read(self._read, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, session: str | None = None, timeout: float = 60, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        command = {"id": self._next_id, "method": method, "params": params,
                   **({"sessionId": session} if session else {})}
        os.write(self._write, json.dumps(command).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            message = self._message(deadline)
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]
            self.events.append(message)

    def wait_for(self, method: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        for event in self.events:
            if event.get("method") == method:
                return event
        while True:
            message = self._message(deadline)
            self.events.append(message)
            if message.get("method") == method:
                return message

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
        os.close(self._write)
        os.close(self._read)


class Page:
    """One open page: evaluate an expression in it, resize its viewport, take a screenshot."""

    def __init__(self, browser: DevTools, session: str):
        self.browser, self.session = browser, session

    def evaluate(self, expression: str) -> Any:
        reply = self.browser.send("Runtime.evaluate", self.session, expression=expression, returnByValue=True)
        if "exceptionDetails" in reply:
            raise RuntimeError(f"{expression}: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def resize(self, width: int, height: int) -> None:
        self.browser.send("Emulation.setDeviceMetricsOverride", self.session, width=width, height=height,
                          deviceScaleFactor=1, mobile=False)

    def screenshot(self) -> bytes:
        return base64.b64decode(self.browser.send("Page.captureScreenshot", self.session, format="png")["data"])

    def requests(self) -> list[str]:
        """The URL of every request the page made, its own included."""
        return [event["params"]["request"]["url"] for event in self.browser.events
                if event.get("method") == "Network.requestWillBeSent" and event.get("sessionId") == self.session]


@contextmanager
def open_page(url: str, width: int = 1280, height: int = 2400) -> Iterator[Page]:
    """`url` loaded in a fresh headless Chromium with a `width` x `height` viewport."""
    with tempfile.TemporaryDirectory() as profile:
        browser = DevTools(Path(profile))
        try:
            target = browser.send("Target.createTarget", url="about:blank")["targetId"]
            session = browser.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            browser.send("Network.enable", session)
            browser.send("Page.enable", session)
            page = Page(browser, session)
            page.resize(width, height)
            browser.send("Page.navigate", session, url=url)
            browser.wait_for("Page.loadEventFired")
            yield page
        finally:
            browser.close()


def render(url: str, width: int = 1280, height: int = 2400) -> tuple[bytes, list[str]]:
    """(a PNG screenshot of the page at `url`, the URL of every request the page made, its own included)."""
    with open_page(url, width, height) as page:
        return page.screenshot(), page.requests()
