"""Debian's chromium, headless, for the browser tests (Playwright drives it; Playwright's own
browsers are never downloaded)."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
# Flags for a sandboxed CI box.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DOCS = Path(__file__).resolve().parents[2] / "docs"

# Skipped without the browser (`make test` installs it as root or with sudo, and says so when it
# cannot); CI sets ART_REQUIRE_CHROMIUM=1, so that there a missing browser fails these tests.
needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists() and not os.environ.get("ART_REQUIRE_CHROMIUM"),
    reason="browser test: needs Debian's chromium at /usr/bin/chromium (make test installs it "
    "as root or with sudo: apt-get install --no-install-recommends chromium)",
)


@asynccontextmanager
async def chromium_page(*extra_args: str, **page_options: Any) -> AsyncIterator[Any]:
    """A new page (30 s timeouts) in a fresh chromium, closed on the way out."""
    from playwright import async_api

    async with async_api.async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=[*CHROMIUM_ARGS, *extra_args]
        )
        try:
            page = await browser.new_page(**page_options)
            page.set_default_timeout(30_000)
            yield page
        finally:
            await browser.close()


async def screenshot_for_docs(page: Any, path: Path, docs_name: str) -> None:
    """The page to `path`, and to docs/`docs_name` when that is missing or
    ART_UPDATE_SCREENSHOTS is set."""
    await page.screenshot(path=str(path))
    docs_file = DOCS / docs_name
    if not docs_file.exists() or os.environ.get("ART_UPDATE_SCREENSHOTS"):
        docs_file.parent.mkdir(exist_ok=True)
        shutil.copyfile(path, docs_file)
