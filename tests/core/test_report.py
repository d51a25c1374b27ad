"""The training report: a before/after table, a PNG reward curve, one self-contained HTML page."""

from __future__ import annotations

from pathlib import Path

from art_core.report import Evaluation, before_after_table, summarize, write_report
from tests.support.browser import chromium_page, needs_chromium


def test_report_has_table_curve_and_examples(tmp_path: Path):
    before = summarize(0, [0.0, 0.5], exact=[0.0, 0.0])
    after = summarize(2, [1.0, 1.0], exact=[1.0, 1.0])
    before.examples = [{"prompt": "What is 1 + 2?", "answer": "To add <b>", "reward": 0.0}]
    after.examples = [{"prompt": "What is 1 + 2?", "answer": "1 + 2 = 3", "reward": 1.0}]
    history = [
        {"type": "log", "split": "val", "step": 0, "metrics": {"reward": 0.25}},
        {"type": "train", "step": 1, "metrics": {"reward": 0.3, "loss": 0.1}},
        {"type": "train", "step": 2, "metrics": {"reward": 0.6, "loss": 0.05}},
        {"type": "log", "split": "val", "step": 2, "metrics": {"reward": 1.0}},
    ]
    page = write_report(
        tmp_path, title="t", description="d", before=before, after=after, history=history,
        settings={"steps": 2},
    )  # fmt: skip

    table = before_after_table(before, after)
    assert "reward" in table and "+0.750" in table and "+1.000" in table
    assert (tmp_path / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = page.read_text()
    assert "data:image/png;base64," in html
    assert "To add &lt;b&gt;" in html  # model output is escaped
    assert html.count("<tr><td>") >= 3  # two training steps and one example


def test_evaluation_metrics_are_means():
    evaluation = summarize(3, [1.0, 0.0, 0.5], format=[1.0, 1.0, 0.0])
    assert evaluation == Evaluation(step=3, metrics={"reward": 0.5, "format": 2 / 3})


def demo_like_history(steps: int) -> list[dict]:
    """Training rows with every column of the per-step table, values as wide as the demo's."""
    metrics = {"reward": 0.484375, "reward_std": 0.3125, "groups/trainable": 7.0,
               "trained_tokens": 5632.0, "loss": -0.01234, "entropy": 1.2345,
               "grad_norm": 0.98765, "clip_fraction": 0.0, "step_seconds": 12.3456}  # fmt: skip
    return [{"type": "train", "step": step, "metrics": metrics} for step in range(1, steps + 1)]


def test_whole_numbers_print_as_whole_numbers(tmp_path: Path):
    evaluation = summarize(0, [1.0])
    page = write_report(
        tmp_path, title="t", description="d", before=evaluation, after=evaluation,
        history=demo_like_history(1), settings={},
    ).read_text()  # fmt: skip
    row = page.split("<tr><td>1</td>", 1)[1].split("</tr>", 1)[0]
    assert "<td>7</td>" in row and "<td>5632</td>" in row and "<td>0</td>" in row
    assert "<td>0.484</td>" in row and "<td>12.346</td>" in row and ".000<" not in row
    assert "step_<wbr>seconds" in page  # a long header may wrap


@needs_chromium
async def test_the_step_table_fits_a_1200_pixel_window(tmp_path: Path):
    evaluation = summarize(0, [1.0])
    page = write_report(
        tmp_path, title="t", description="d", before=evaluation, after=evaluation,
        history=demo_like_history(10), settings={},
    )  # fmt: skip
    async with chromium_page(viewport={"width": 1200, "height": 800}) as browser_page:
        await browser_page.goto(page.as_uri())
        sizes = await browser_page.evaluate(
            """() => ({table: document.querySelector("table.steps").getBoundingClientRect().right,
                       body: document.body.getBoundingClientRect().right,
                       scroll: document.documentElement.scrollWidth,
                       window: document.documentElement.clientWidth})"""
        )
    assert sizes["table"] <= sizes["body"] and sizes["scroll"] <= sizes["window"], sizes
