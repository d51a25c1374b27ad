"""The review page in a real browser (headless Debian chromium driven by Playwright).

A person opens a held step, opens a group, flags a trajectory with a reason and approves the
step; the trainer's step then leaves that trajectory out and counts it. Behind a key, the login
and the forms work, and a page on another origin cannot post them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import art_core as art
from art_backend.testing import list_pending
from tests.support.browser import (
    CHROMIUM_ARGS,  # noqa: F401 - tests/core/test_tracker_trackio.py imports it from here
    chromium_page,
    needs_chromium,
    screenshot_for_docs,
)
from tests.support.models import fresh_model
from tests.support.review_data import MODEL, PROJECT, start_review_server, write_review_store
from tests.support.rollouts import groups_for, varied_group
from tests.support.servers import RunningServer

pytest.importorskip("playwright.async_api", reason="pip install playwright ([dev])")
pytestmark = needs_chromium


def judged(groups: list[art.TrajectoryGroup]) -> list[art.TrajectoryGroup]:
    """Distinct rewards, a judge-style explanation and a metric on every trajectory."""
    for group in varied_group(groups):
        for trajectory in group.trajectories:
            answer = str(trajectory.messages()[-1].get("content", ""))
            trajectory.log(f"RULER: scored {trajectory.reward:g} for answering {answer[:20]!r}")
            trajectory.metrics["answer_chars"] = len(answer)
    return groups


async def test_flag_a_trajectory_of_a_held_step_in_the_browser(
    remote_backend: art.RemoteBackend,
    training_server: RunningServer,
    tiny_model_dir: Path,
    tmp_path: Path,
):
    model = await fresh_model(remote_backend, tiny_model_dir)
    await model.train(judged(await groups_for(model, ["What is 1 + 1?", "What is 2 + 3?"])))
    groups = judged(await groups_for(model, ["What is 3 + 4?", "What is 5 + 6?"]))
    training = asyncio.create_task(
        model.train(groups, config=art.TrainConfig(review_hold_seconds=600))
    )
    model_dir = Path(training_server.art_path) / model.project / "models" / model.name
    for _ in range(1200):
        if list_pending(model_dir):
            break
        await asyncio.sleep(0.05)

    try:
        async with chromium_page(viewport={"width": 1280, "height": 900}) as page:
            await page.goto(f"{training_server.url}/review/")
            await page.click(f"text={model.project}/{model.name}")

            # The model's page: the reward curve, and the held step with its approve button.
            assert await page.locator('svg[aria-label="reward (x: step sampled at)"]').count() == 1
            held = page.locator(".box.pending")
            assert "Pending step (sampled at step 1)" in await held.inner_text()
            await held.locator("text=review it").click()

            # The held step: its groups, then group 0 side by side, best reward first.
            assert await page.locator("svg.plot").count() == 1
            await page.click('a:has-text("Group 0")')
            cards = page.locator(".card")
            assert await cards.count() == 4
            assert "judge" in await cards.first.inner_text()
            target = cards.nth(1)
            flagged_id = await target.get_attribute("data-trajectory")
            await target.locator("form.flag-trajectory input[name=reason]").fill(
                "repeats the question instead of answering"
            )
            await target.locator("form.flag-trajectory input[name=who]").fill("ann")
            await target.locator("form.flag-trajectory button").click()

            # Back on the trajectory's own page: flagged, by whom, why.
            await page.wait_for_selector(".badge.flag")
            text = await page.locator(".card").inner_text()
            assert "Flagged by ann" in text and "repeats the question" in text
            await page.go_back()
            await page.reload()
            flagged_card = page.locator(f'.card[data-trajectory="{flagged_id}"]')
            assert "flagged" in (await flagged_card.get_attribute("class") or "")
            await screenshot_for_docs(page, tmp_path / "review-group.png", "review.png")

            # Approve: the trainer applies the flag, trains, and counts it.
            await page.click(f"text={model.project}/{model.name}")
            await page.click("text=Approve now")
            result = await asyncio.wait_for(training, 120)
            assert result.step == 2
            assert result.metrics["review/flagged_trajectories"] == 1
            assert result.metrics["rows"] == 7  # 8 rollouts, the flagged one left out

            # The trained step shows the flagged trajectory as such, and what the trainer did.
            await page.goto(f"{training_server.url}/review/{model.project}/{model.name}/")
            await page.click('a[href$="/steps/train/1"]')
            chip = page.locator(f'.chips a[title="{flagged_id}"]')
            assert "flagged" in (await chip.get_attribute("class") or "")
            await chip.click()
            assert (
                "trainer applied: flagged_trajectories" in await page.locator(".card").inner_text()
            )
            await page.screenshot(path=str(tmp_path / "review-trajectory.png"))
    finally:
        if not training.done():
            training.cancel()


async def test_behind_a_key_the_forms_work_and_other_pages_cannot_post_them(tmp_path: Path):
    """Log in, flag through the page's form (it carries the CSRF token); then a page on another
    port of the same host (same site: the SameSite=Lax cookie goes along) posts the same form,
    and a DNS-rebinding name opens nothing: both refused, the decision log unchanged."""
    write_review_store(tmp_path)
    server, thread, url = start_review_server(tmp_path, api_key="browser-key")
    port = urlsplit(url).port
    step0 = f"{url}/review/{PROJECT}/{MODEL}/steps/train/0"
    log = tmp_path / PROJECT / "models" / MODEL / "review" / "decisions.jsonl"
    evil_page = (
        f'<form method="post" action="{step0}/decisions">'
        '<input type="hidden" name="action" value="flag_trajectory">'
        '<input type="hidden" name="trajectory_id" value="t0-b">'
        '<input type="hidden" name="reason" value="forged"></form>'
        "<script>document.forms[0].submit()</script>"
    )
    # evil.example resolves to this machine, as it does after DNS rebinding.
    rules = "--host-resolver-rules=MAP evil.example 127.0.0.1"
    try:
        async with chromium_page(rules) as page:
            await page.goto(f"{step0}/groups/0")
            await page.fill("input[name=key]", "browser-key")
            await page.click("text=Log in")
            card = page.locator('.card[data-trajectory="t0-a"]')
            await card.locator("form.flag-trajectory input[name=reason]").fill("from the page")
            await card.locator("form.flag-trajectory button").click()
            await page.wait_for_selector(".badge.flag")
            flagged = log.read_text()
            assert "from the page" in flagged

            # Served from 127.0.0.1 on another port: another origin, the same site.
            await page.route(
                "http://127.0.0.1:1/**",
                lambda route: route.fulfill(body=evil_page, content_type="text/html"),
            )
            async with page.expect_response(f"{step0}/decisions") as posted:
                await page.goto("http://127.0.0.1:1/innocent")
            assert (await posted.value).status == 403
            assert "another site" in await page.inner_text("body")

            await page.goto(f"http://evil.example:{port}/review/")
            assert "--allowed-hosts" in await page.inner_text("body")
            assert log.read_text() == flagged
    finally:
        server.should_exit = True
        thread.join(10)
