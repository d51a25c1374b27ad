"""The training report: a before/after table, a PNG reward curve, one self-contained HTML page."""

from __future__ import annotations

from pathlib import Path

from art_core.report import Evaluation, before_after_table, summarize, write_report


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
