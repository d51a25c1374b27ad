"""The behaviour diff page in a real browser (headless Debian chromium driven by Playwright).

A person opens a model's page, follows the link to the diff, picks steps 0 and 1, reads the
counts, filters to the newly wrong examples and sees both answers side by side.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import art_core as art
from tests.server.review.test_diff import LONG_PARIS, log_held_out_steps
from tests.support.browser import chromium_page, needs_chromium, screenshot_for_docs
from tests.support.models import fresh_model
from tests.support.servers import RunningServer

pytest.importorskip("playwright.async_api", reason="pip install playwright ([dev])")
pytestmark = needs_chromium


async def test_compare_two_steps_filter_and_read_both_answers_in_the_browser(
    remote_backend: art.RemoteBackend,
    training_server: RunningServer,
    tiny_model_dir: Path,
    tmp_path: Path,
):
    model = await fresh_model(remote_backend, tiny_model_dir)
    await log_held_out_steps(model)

    async with chromium_page(viewport={"width": 1280, "height": 900}) as page:
        await page.goto(f"{training_server.url}/review/{model.project}/{model.name}/")
        await page.click("a.diff-link")

        # The picker: the val split's steps, the latest preselected as `to`.
        picker = page.locator("form.diff-picker")
        await picker.locator("select[name=from]").select_option("0")
        assert await picker.locator("select[name=to]").input_value() == "1"
        await picker.locator("button").click()

        # The counts at the top, each a link that filters.
        await page.wait_for_selector(".counts")
        assert "6 examples compared" in await page.locator("p.summary").inner_text()
        counts = {
            await cell.get_attribute("data-tag"): (await cell.locator("b").inner_text())
            for cell in await page.locator(".counts a").all()
        }
        assert counts == {
            "all": "6",
            "newly_right": "1",
            "newly_wrong": "1",
            "format_changed": "1",
            "length_changed": "1",
            "tools_changed": "1",
            "changed": "4",
            "unchanged": "2",
        }
        assert await page.locator(".example").count() == 6

        # Filter: the newly wrong example, step 0's answer beside step 1's.
        await page.click('.counts a[data-tag="newly_wrong"]')
        await page.wait_for_selector('.counts a.on[data-tag="newly_wrong"]')
        examples = page.locator(".example")
        assert await examples.count() == 1
        example = examples.first
        assert "What is the capital of France?" in await example.inner_text()
        before = await example.locator(".answer.before").inner_text()
        after = await example.locator(".answer.after").inner_text()
        assert "step 0" in before and "Paris" in before and "right" in before
        assert "step 1" in after and LONG_PARIS in after and "wrong" in after
        assert (await example.locator(".answer.before").bounding_box())["x"] < (  # type: ignore[index]
            await example.locator(".answer.after").bounding_box()  # type: ignore[index]
        )["x"]  # side by side: before on the left

        # The screenshot in the docs: every example, tags and both answers.
        await page.click('.counts a[data-tag="changed"]')
        await page.wait_for_selector('.counts a.on[data-tag="changed"]')
        assert await page.locator(".example").count() == 4
        await screenshot_for_docs(page, tmp_path / "diff.png", "diff.png")
