"""Headless Chromium (Debian's `chromium`) driven over the DevTools protocol through a pipe
(`--remote-debugging-pipe`: JSON messages ending in NUL on descriptors 3 and 4), so no WebSocket client and no
browser-automation package is needed. Enough for the view's tests and its benchmark: open a page, wait for its
load, evaluate an expression, take a screenshot, and keep what the page logged (console, exceptions, CSP
violations)."""

import base64
import contextlib
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class BrowserError(RuntimeError):
    """The browser answered a command with an error, died, or did not answer in time."""


class Browser:
    """One headless Chromium with one page (`tab`)."""

    def __init__(self, profile: Path, width: int = 1280, height: int = 900) -> None:
        if CHROMIUM is None:
            raise BrowserError("chromium is not installed")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def on_3_and_4() -> None:
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        args = [CHROMIUM, "--headless=new", "--remote-debugging-pipe", f"--user-data-dir={profile}",
                "--no-first-run", "--no-default-browser-check", "--disable-gpu", "--disable-extensions",
                "--disable-background-networking", "--disable-dev-shm-usage", "--hide-scrollbars",
                f"--window-size={width},{height}", *(["--no-sandbox"] if os.geteuid() == 0 else []),
                "about:blank"]  # fmt: skip
        self.proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(3, 4, to_browser_r, from_browser_w), preexec_fn=on_3_and_4, start_new_session=True,
        )  # fmt: skip
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer, self._next_id = b"", 0
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.tab(f"{domain}.enable")

    def call(self, method: str, session: str | None = None, timeout: float = 30.0, **params: Any) -> Any:
        """Send one command (to the browser, or to a session) and wait for its answer."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._receive(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def tab(self, method: str, timeout: float = 30.0, **params: Any) -> Any:
        """A command to the page."""
        return self.call(method, self.session, timeout, **params)

    def _receive(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise BrowserError("the browser did not answer in time")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise BrowserError("the browser closed its pipe")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        parsed: dict[str, Any] = json.loads(message)
        return parsed

    def wait_for(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        """The next event `method` of the page (those already received count)."""
        deadline = time.monotonic() + timeout
        while True:
            for n, event in enumerate(self.events):
                if event.get("method") == method:
                    del self.events[n]
                    return event
            self.events.append(self._receive(deadline))

    def open(self, url: str, timeout: float = 60.0) -> None:
        """Navigate and wait for the page's load event."""
        self.events = [e for e in self.events if e.get("method") != "Page.loadEventFired"]
        self.tab("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired", timeout)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited when it is a promise)."""
        result = self.tab("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path, full_page: bool = False) -> Path:
        """The page as a PNG at `path`."""
        data = self.tab("Page.captureScreenshot", format="png", captureBeyondViewport=full_page)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def logged(self) -> list[str]:
        """What the page logged so far: console messages, uncaught exceptions, browser log entries (CSP)."""
        said = []
        for e in self.events:
            p = e.get("params", {})
            if e.get("method") == "Runtime.consoleAPICalled":
                said.append(
                    "console: " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"])
                )
            elif e.get("method") == "Runtime.exceptionThrown":
                said.append("exception: " + json.dumps(p["exceptionDetails"])[:500])
            elif e.get("method") == "Log.entryAdded":
                said.append(f"log: {p['entry'].get('source')}: {p['entry'].get('text')}")
        return said

    def close(self) -> None:
        with contextlib.suppress(BrowserError, OSError):
            self.call("Browser.close", timeout=5)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(10)
        os.close(self._to_browser)
        os.close(self._from_browser)
