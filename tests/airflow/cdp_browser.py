"""Headless Chromium driven over the Chrome DevTools Protocol, for tests that click through a real UI.

One page, synchronous calls over the page's websocket (`websockets.sync`): navigate, evaluate
JavaScript, wait for a condition, click an element found by its text, fill inputs the way a person's
typing reaches a React form, and take screenshots.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class CdpError(RuntimeError):
    """The browser answered a command with an error, or a wait ran out."""


class Browser:
    """A headless Chromium with one page of `width` x `height` CSS pixels."""

    def __init__(self, profile: Path, width: int = 1400, height: int = 900, log: Path | None = None) -> None:
        if CHROMIUM is None:
            raise CdpError("chromium is not installed")
        profile.mkdir(parents=True, exist_ok=True)
        self._log = (log or profile / "chromium.log").open("w")
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--remote-debugging-port=0", f"--user-data-dir={profile}",
             f"--window-size={width},{height}", "about:blank"],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        self._ids = itertools.count(1)
        self.ws = self._connect(profile)
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=False)

    def _connect(self, profile: Path):
        import httpx
        from websockets.sync.client import connect

        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.is_file() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise CdpError(f"chromium did not open its DevTools port (exit {self.proc.poll()})")
            time.sleep(0.2)
        port = int(port_file.read_text().split()[0])
        while True:
            try:
                pages = [t for t in httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
                         if t.get("type") == "page"]
                if pages:
                    return connect(pages[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=30,
                                   ping_interval=None, legacy=True)
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise CdpError("chromium has no page to drive")
            time.sleep(0.2)

    def call(self, method: str, timeout: float = 60.0, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its answer (events in between are dropped)."""
        ident = next(self._ids)
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("id") == ident:
                if "error" in message:
                    raise CdpError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        # a DOM node cannot travel by value: it comes back as true
        wrapped = f"(async () => {{ const v = await ({expression}); return v instanceof Node ? true : v; }})()"
        result = self.call("Runtime.evaluate", expression=wrapped, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise CdpError(f"{expression[:80]}: {result['exceptionDetails'].get('text')} "
                           f"{result['exceptionDetails'].get('exception', {}).get('description', '')}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 60.0, what: str = "") -> Any:
        """Poll `expression` until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(CdpError):
                value = self.evaluate(expression)
                if value:
                    return value
            if time.monotonic() > deadline:
                raise CdpError(f"timed out waiting for {what or expression[:120]} at {self.location()}")
            time.sleep(0.5)

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'", what=f"{url} to load")

    def location(self) -> str:
        with contextlib.suppress(CdpError, TimeoutError):
            return str(self.evaluate("document.location.href"))
        return "?"

    def fill(self, selector: str, value: str) -> None:
        """Set an input's value as typing would (React and react-hook-form see the change)."""
        self.evaluate(f"""(() => {{
            const input = document.querySelector({json.dumps(selector)});
            const setter = Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set;
            setter.call(input, {json.dumps(value)});
            input.dispatchEvent(new Event('input', {{bubbles: true}}));
            input.dispatchEvent(new Event('change', {{bubbles: true}}));
            return true; }})()""")

    def button(self, text: str, within: str = "document") -> str:
        """A JavaScript expression for the visible button whose text is `text` (inside `within`)."""
        return (f"[...({within}).querySelectorAll('button')].find(b => b.innerText.trim() === {json.dumps(text)} "
                f"&& b.offsetParent !== null)")

    def click(self, element_expression: str) -> None:
        """Click the element an expression finds, with real mouse events at its centre."""
        box = self.wait_for(f"(() => {{ const e = {element_expression}; if (!e) return null; "
                            "e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect(); "
                            "return {x: r.x + r.width / 2, y: r.y + r.height / 2}; })()",
                            what=f"element {element_expression[:100]}")
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box["x"], y=box["y"], button="left", clickCount=1)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()
