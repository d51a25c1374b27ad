"""The training report: a before/after table, a reward-curve PNG and one self-contained HTML page.

Used by `make demo` and by every example that trains (the same format everywhere). matplotlib
is imported only here, only when a report is written (extra `[report]`).
"""

from __future__ import annotations

import base64
import html
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Evaluation:
    """A held-out evaluation at one step: metric means and a few examples to show."""

    step: int
    metrics: dict[str, float]
    examples: list[dict[str, Any]] = field(default_factory=list)  # prompt, answer, reward


def summarize(step: int, rewards: list[float], **metric_lists: list[float]) -> Evaluation:
    """An Evaluation from per-item rewards and other per-item metrics (means are kept)."""
    metrics = {"reward": statistics.fmean(rewards) if rewards else 0.0}
    for name, values in metric_lists.items():
        metrics[name] = statistics.fmean(values) if values else 0.0
    return Evaluation(step=step, metrics=metrics)


def before_after_table(before: Evaluation, after: Evaluation) -> str:
    """A plain-text table: metric, step before, step after, change."""
    header = f"{'metric':<22}{'step ' + str(before.step):>12}{'step ' + str(after.step):>12}{'change':>10}"
    lines = [header, "-" * len(header)]
    for name in before.metrics:
        old, new = before.metrics[name], after.metrics.get(name, float("nan"))
        lines.append(f"{name:<22}{old:>12.3f}{new:>12.3f}{new - old:>+10.3f}")
    return "\n".join(lines)


def mean_metric(groups: list[Any], metric: str) -> float:
    """The mean of one trajectory metric over every trajectory of `groups` (0 when none)."""
    values = [float(t.metrics[metric]) for g in groups for t in g.trajectories]
    return statistics.fmean(values) if values else 0.0


def print_summary(
    before: Evaluation,
    after: Evaluation,
    report: Path | None,
    *,
    examples: int = 3,
    minutes: float | None = None,
    trackers: list[str] | None = None,
) -> None:
    """Print what every training program prints at the end: the before/after table, a few
    held-out answers before and after, where the report is and where the tracker runs are
    (`art_core.trackers.tracker_links`)."""
    print()
    print(before_after_table(before, after))
    print()
    for b, a in list(zip(before.examples, after.examples, strict=False))[:examples]:
        print(b.get("prompt", ""))
        for label, item in (("before", b), ("after", a)):
            print(f"  {label} (reward {_number(item.get('reward'))}):")
            print("    " + str(item.get("answer", "")).replace("\n", "\n    "))
    if report is not None:
        print(f"\nReport: {report}\nReward curve: {report.parent / 'reward.png'}")
    for link in trackers or []:
        print(f"Tracker: {link}")
    if minutes is not None:
        print(f"Total {minutes:.1f} min")


def plot_rewards(history: list[dict[str, Any]], path: Path, *, title: str) -> Path:
    """Train reward per step and held-out reward at each evaluation, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [
        (row["step"] - 1, row["metrics"]["reward"]) for row in history if row.get("type") == "train"
    ]
    val = [
        (row["step"], row["metrics"]["reward"])
        for row in history
        if row.get("type") == "log" and row.get("split") == "val"
    ]
    figure, axes = plt.subplots(figsize=(7, 4), dpi=110)
    if train:
        axes.plot(*zip(*train, strict=True), marker=".", label="train reward (sampled rollouts)")
    if val:
        axes.plot(
            *zip(*val, strict=True), marker="o", linewidth=2, label="held-out reward (greedy)"
        )
    axes.set_xlabel("step (policy that produced the rollouts)")
    axes.set_ylabel("mean reward")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path


def write_report(
    folder: Path,
    *,
    title: str,
    description: str,
    before: Evaluation,
    after: Evaluation,
    history: list[dict[str, Any]],
    settings: dict[str, Any],
    trackers: list[str] | None = None,
) -> Path:
    """Write `reward.png` and `report.html` into `folder`; returns the HTML path. `trackers`:
    where the run is in each experiment tracker (a W&B URL, a local path and command)."""
    folder.mkdir(parents=True, exist_ok=True)
    png = plot_rewards(history, folder / "reward.png", title=title)
    image = base64.b64encode(png.read_bytes()).decode()
    train_rows = [row for row in history if row.get("type") == "train"]
    columns = ["reward", "reward_std", "groups/trainable", "trained_tokens", "loss", "entropy",
               "grad_norm", "clip_fraction", "step_seconds"]  # fmt: skip
    step_table = "".join(
        "<tr><td>{}</td>{}</tr>".format(
            row["step"],
            "".join(f"<td>{_number(row['metrics'].get(c))}</td>" for c in columns),
        )
        for row in train_rows
    )
    examples = "".join(
        "<tr><td>{}</td><td><pre>{}</pre></td><td>{}</td><td><pre>{}</pre></td><td>{}</td></tr>".format(
            html.escape(str(b.get("prompt", ""))),
            html.escape(str(b.get("answer", ""))),
            _number(b.get("reward")),
            html.escape(str(a.get("answer", ""))),
            _number(a.get("reward")),
        )
        for b, a in zip(before.examples, after.examples, strict=False)
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;padding:0 1em}}
table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}
td pre{{margin:0;text-align:left;white-space:pre-wrap}}th{{background:#f4f4f4}}
table.steps{{font-size:.9em}}table.steps td,table.steps th{{padding:3px 5px}}</style></head>
<body><h1>{html.escape(title)}</h1><p>{html.escape(description)}</p>
<h2>Held-out evaluation</h2><pre>{html.escape(before_after_table(before, after))}</pre>
<img alt="reward curve" src="data:image/png;base64,{image}">
<h2>Training steps</h2><table class="steps"><tr><th>step</th>{"".join(f"<th>{_header(c)}</th>" for c in columns)}</tr>{step_table}</table>
<h2>Held-out examples (step {before.step} vs step {after.step})</h2>
<table><tr><th>prompt</th><th>before</th><th>reward</th><th>after</th><th>reward</th></tr>{examples}</table>
{_trackers_html(trackers or [])}<h2>Settings</h2><pre>{html.escape(_settings_text(settings))}</pre>
</body></html>
"""
    path = folder / "report.html"
    path.write_text(page)
    return path


def _trackers_html(links: list[str]) -> str:
    """The tracker runs: a URL as a link, a local location as text."""
    if not links:
        return ""
    items = "".join(
        f'<li><a href="{html.escape(link)}">{html.escape(link)}</a></li>'
        if link.startswith(("http://", "https://"))
        else f"<li><code>{html.escape(link)}</code></li>"
        for link in links
    )
    return f"<h2>Experiment trackers</h2><ul>{items}</ul>\n"


def _number(value: Any) -> str:
    """A float with 3 decimals, a whole number as one (`3`, not `3.000`), anything else as text."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:.3f}"
    return "" if value is None else html.escape(str(value))


def _header(name: str) -> str:
    """A metric's name as a column header that may wrap after `/` and `_` (`step_seconds` in a
    narrow window)."""
    return html.escape(name).replace("/", "/<wbr>").replace("_", "_<wbr>")


def _settings_text(settings: dict[str, Any]) -> str:
    return "\n".join(f"{key}: {value}" for key, value in settings.items())
