"""Headless Chromium (the system's Debian package) inside a test host, driven by playwright.

The browser runs in the host's network namespace through a wrapper script (``ip netns
exec NS chromium ...``); playwright talks to it over a pipe, so nothing of the browser
reaches the machine's own network. Flags: see ../shared/LIBRARY-FACTS.md (WebGPU through
SwiftShader, WebRTC between the page and aiortc on loopback and the host's veth address).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

FLAGS = ["--no-sandbox", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--enable-unsafe-webgpu",
         "--enable-unsafe-swiftshader", "--allow-loopback-in-peer-connection",
         "--disable-features=WebRtcHideLocalIpsWithMdns"]


def missing() -> str | None:
    """What the browser tests lack here (None: they can run)."""
    from tests.system.netns import unavailable

    if why := unavailable():
        return why
    if shutil.which("chromium") is None:
        return "chromium is not installed (as root: apt-get install -y chromium; `make test` does)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[test]')"
    return None


def require() -> None:
    """Skip without a browser (a failure under CI: tests/conftest.py)."""
    why = missing()
    if why is not None:
        pytest.skip(f"the browser tests need {why}")


def wrapper(tmp: Path, ns: str) -> Path:
    """An executable that starts the system chromium inside namespace ``ns``."""
    script = tmp / f"chromium-in-{ns}"
    script.write_text(f'#!/bin/sh\nexec ip netns exec {ns} {shutil.which("chromium")} "$@"\n')
    script.chmod(0o700)
    return script


class Browser:
    """One playwright-driven Chromium in a namespace; :meth:`close` ends both."""

    def __init__(self, tmp: Path, ns: str, pw=None) -> None:
        """``pw``: a started playwright to launch with (one thread can run only one at a
        time, so tests that hold several browsers share one); None: one of its own."""
        from playwright.sync_api import sync_playwright

        self._own = pw is None
        self._pw = sync_playwright().start() if pw is None else pw
        try:
            self.browser = self._pw.chromium.launch(executable_path=str(wrapper(tmp, ns)),
                                                    args=FLAGS, headless=True, timeout=60_000)
        except BaseException:
            if self._own:
                self._pw.stop()
            raise

    def page(self, init_script: str | None = None):
        """A page in a fresh context (its own IndexedDB and localStorage)."""
        ctx = self.browser.new_context(viewport={"width": 900, "height": 900},
                                       bypass_csp=True)  # lets the test evaluate JS
        if init_script:
            ctx.add_init_script(init_script)
        page = ctx.new_page()
        page.set_default_timeout(60_000)
        self.console: list[str] = getattr(self, "console", [])
        page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        return page

    def close(self) -> None:
        try:
            self.browser.close()
        finally:
            if self._own:
                self._pw.stop()
