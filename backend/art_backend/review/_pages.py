"""The review pages, one function each: models, a model, a step, a group, a trajectory, search.

Each takes what `_review_browse` read and returns the whole HTML page (building blocks in
`_review_html`, plots in `_review_plots`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from art_backend.review._browse import (
    PENDING,
    GroupView,
    ModelSummary,
    StepEntry,
    StepView,
    TrajectoryView,
    message_text,
)
from art_backend.review._html import (
    PREFIX,
    Reviewer,
    Urls,
    badges,
    e,
    filter_form,
    group_forms,
    metrics_grid,
    number,
    page,
    reward_text,
    trajectory_card,
    when,
)
from art_backend.review._plots import Series, line_chart, reward_strip
from art_backend.store._checkpoints import ModelStore
from art_backend.store._review_decisions import PendingStep

# Plotted by default on a model's page (when present); `?metrics=all` plots every metric.
DEFAULT_PLOTS = (
    "loss",
    "reward_std",
    "entropy",
    "grad_norm",
    "clip_fraction",
    "kl",
    "trained_tokens",
    "groups/trainable",
    "groups/zero_variance",
    "exceptions",
    "review/flagged_trajectories",
    "review/flagged_groups",
    "review/reward_overrides",
)
SEARCH_LIMIT = 200


def _crumbs(store: ModelStore | None = None, *more: tuple[str, str | None]):
    crumbs: list[tuple[str, str | None]] = [("review", f"{PREFIX}/")]
    if store is not None:
        crumbs.append((f"{store.project}/{store.name}", Urls(store.project, store.name).model))
    return [*crumbs, *more]


def index_page(root: Path, models: list[ModelSummary]) -> str:
    if not models:
        body = f'<p class="box">No models under <code>{e(root)}</code> yet: train one (docs/getting-started.md).</p>'
        return page("Models", _crumbs(), body)
    rows = "".join(
        f'<tr><td><a href="{e(Urls(m.project, m.name).model)}">{e(m.project)}/{e(m.name)}</a>'
        + (f'<span class="badge hold">{m.pending} held for review</span>' if m.pending else "")
        + f'</td><td class="num">{"—" if m.step is None else m.step}</td>'
        f'<td class="num">{m.train_steps}</td><td class="num">{number(m.last_reward)}</td>'
        f'<td class="num">{m.decisions}</td></tr>'
        for m in models
    )
    body = (
        f'<p class="muted">Under <code>{e(root)}</code>.</p><table><tr><th>model</th>'
        "<th>latest checkpoint</th><th>train steps</th><th>last reward</th><th>review decisions</th>"
        f"</tr>{rows}</table>"
    )
    return page("Models", _crumbs(), body)


def _refused_mark(entry: StepEntry, refused: set[int]) -> str:
    """A promotion gate's refusal, on the step it judged (train rollouts of N made step N + 1)."""
    judged = entry.step + 1 if entry.split == "train" else entry.step
    if judged not in refused:
        return ""
    return f' <span class="muted refused">step {judged} not promoted</span>'


def model_page(
    store: ModelStore,
    steps: list[StepEntry],
    history: list[dict[str, Any]],
    pending: list[PendingStep],
    approved: set[str],
    decisions: list[dict[str, Any]],
    *,
    all_metrics: bool,
    reviewer: Reviewer,
) -> str:
    urls = Urls(store.project, store.name)
    parts = [_pending_boxes(urls, pending, approved, reviewer), _tracker_runs(history)]

    parts.append(_metric_plots(urls, history, all_metrics=all_metrics))
    parts.append("<h2>Steps</h2>")
    verdicts = {r["step"]: r.get("promoted") for r in history if r.get("type") == "promotion"}
    refused = {step for step, promoted in verdicts.items() if not promoted}
    if steps:
        rows = "".join(
            f'<tr><td>{e(s.split)}</td><td class="num"><a href="{e(urls.step(s.split, str(s.step)))}">'
            f"step {s.step}</a>{_refused_mark(s, refused)}</td>"
            f'<td class="num">{number(s.metrics.get("reward"))}</td>'
            f'<td class="num">{number(s.metrics.get("groups/submitted"))}</td>'
            f'<td class="num">{number(s.metrics.get("trajectories"))}</td>'
            f'<td class="num">{number(s.metrics.get("review/flagged_trajectories"))}</td>'
            f'<td class="num">{number(s.metrics.get("review/flagged_groups"))}</td>'
            f'<td class="num">{number(s.metrics.get("review/reward_overrides"))}</td></tr>'
            for s in reversed(steps)
        )
        parts.append(
            "<table><tr><th>split</th><th>step (sampled at)</th><th>reward</th><th>groups</th>"
            "<th>trajectories</th><th>flagged trajectories</th><th>flagged groups</th>"
            f"<th>reward overrides</th></tr>{rows}</table>"
        )
    else:
        parts.append('<p class="muted">No logged trajectories yet.</p>')

    splits = sorted({s.split for s in steps})
    parts.append(
        f'<p><a class="diff-link" href="{e(urls.model)}diff">Behaviour diff</a>: the held-out '
        "answers of two steps side by side, what became right, wrong, longer, ...</p>"
    )
    parts.append("<h2>Search every step</h2>")
    parts.append(filter_form(urls.search(), {}, with_split=True, splits=splits))
    parts.append(_decision_log(urls, decisions, {p.id for p in pending}))
    return page(f"{store.project}/{store.name}", _crumbs(store), "".join(parts))


def _tracker_runs(history: list[dict[str, Any]]) -> str:
    """Where the experiment trackers show the model's runs ("tracker" rows): a URL as a link,
    a local run as its folder and the command that opens it."""
    seen: dict[str, str] = {}
    for row in history:
        if row.get("type") == "tracker" and (row.get("url") or row.get("how_to_open")):
            name, url = e(row.get("tracker", "")), row.get("url")
            item = (
                f'<a href="{e(url)}">{name}</a>'
                if url
                else f"{name}: <code>{e(row['how_to_open'])}</code>"
            )
            seen.setdefault(str(url or row["how_to_open"]), item)
    if not seen:
        return ""
    return f'<p class="tracker-runs">Tracker runs: {"; ".join(seen.values())}</p>'


def _metric_plots(urls: Urls, history: list[dict[str, Any]], *, all_metrics: bool) -> str:
    """The reward curve (train and each logged split) and the step metrics' charts."""
    train_rows = [row for row in history if row.get("type") == "train"]
    val_splits = sorted({row.get("split", "") for row in history if row.get("type") == "log"})
    reward = [
        Series(
            "train",
            [
                (row["step"] - 1, row["metrics"]["reward"])
                for row in train_rows
                if "reward" in row["metrics"]
            ],
        )
    ]
    for split in val_splits:
        points = [
            (row["step"], row["metrics"]["reward"])
            for row in history
            if row.get("type") == "log" and row.get("split") == split and "reward" in row["metrics"]
        ]
        reward.append(Series(split, points))
    names = sorted({key for row in train_rows for key in row["metrics"]} - {"reward"})
    plotted = names if all_metrics else [name for name in DEFAULT_PLOTS if name in names]
    plots = [line_chart(reward, title="reward (x: step sampled at)", width=520, height=220)]
    for name in plotted:
        series = [
            Series(
                name,
                [
                    (row["step"] - 1, row["metrics"][name])
                    for row in train_rows
                    if isinstance(row["metrics"].get(name), int | float)
                ],
            )
        ]
        plots.append(line_chart(series, title=name))
    toggle = (
        f'<a href="{e(urls.model)}">fewer metrics</a>'
        if all_metrics
        else (
            f'<a href="{e(urls.model)}?metrics=all">all {len(names)} metrics</a>' if names else ""
        )
    )
    return f'<h2>Reward and step metrics <small>{toggle}</small></h2><div class="plots">{"".join(plots)}</div>'


def _pending_boxes(
    urls: Urls, pending: list[PendingStep], approved: set[str], reviewer: Reviewer
) -> str:
    boxes = []
    now = time.time()
    for held in pending:
        if held.id in approved:
            state = "approved: training (or queued)"
        elif now >= held.expires_at:
            state = "hold expired: training (or queued)"
        else:
            state = f"held for review, {held.expires_at - now:.0f} s left"
        boxes.append(
            f'<div class="box pending" data-pending="{e(held.id)}"><b>Pending step</b> (sampled at '
            f"step {held.step}): {held.groups} groups, {held.trajectories} trajectories · {e(state)} · "
            f'<a href="{e(urls.step(PENDING, held.id))}">review it</a>'
            f"{_approve_form(urls, held, approved, reviewer)}</div>"
        )
    return "".join(boxes)


def _approve_form(urls: Urls, held: PendingStep, approved: set[str], reviewer: Reviewer) -> str:
    if held.id in approved or time.time() >= held.expires_at:
        return ""
    return (
        f'<form class="inline approve" method="post" action="{e(urls.approve(held.id))}">'
        f'<input type="hidden" name="next" value="{e(urls.model)}">'
        f"{reviewer.fields()}"
        '<button>Approve now</button> <span class="muted">flags and overrides made until then '
        "are applied</span></form>"
    )


def _decision_log(urls: Urls, decisions: list[dict[str, Any]], held: set[str]) -> str:
    if not decisions:
        return '<h2>Review decisions</h2><p class="muted">None yet.</p>'
    rows = []
    for row in reversed(decisions[-100:]):
        where = row.get("where") or {}
        target = row.get("trajectory_id") or (
            f"group {where.get('group')}" if "group" in where else "the held step"
        )
        link = _where_link(urls, where, held)
        value = f" → {number(row['reward'])}" if "reward" in row else ""
        rows.append(
            f"<tr><td>{e(when(row['at']))}</td><td>{e(row.get('who') or '')}</td>"
            f"<td>{e(row.get('source', 'page'))}</td><td>{e(row['action'])}{value}</td><td>{e(target)}</td><td>{link}</td>"
            f"<td>{e(row.get('reason') or '')}</td></tr>"
        )
    return (
        '<h2>Review decisions <small class="muted">(append-only, newest first)</small></h2>'
        "<table><tr><th>at</th><th>who</th><th>source</th><th>action</th><th>target</th><th>where</th>"
        f"<th>reason</th></tr>{''.join(rows)}</table>"
    )


def _where_link(urls: Urls, where: dict[str, Any], held: set[str]) -> str:
    """A link to where a decision was made; a held step that has trained links to its train step."""
    if "split" not in where:
        return ""
    split, step = str(where["split"]), str(where["step"])
    if split != PENDING:
        return f'<a href="{e(urls.step(split, step))}">{e(split)} step {e(step)}</a>'
    if step in held:
        return f'<a href="{e(urls.step(split, step))}">held step (sampled at {e(where.get("sampled_at"))})</a>'
    sampled_at = str(where.get("sampled_at", ""))
    return (
        f'<a href="{e(urls.step("train", sampled_at))}">train step {e(sampled_at)}</a> (was held)'
    )


def step_page(
    store: ModelStore,
    view: StepView,
    shown: list[GroupView],
    query: dict[str, str],
    approved: set[str],
    reviewer: Reviewer,
) -> str:
    urls = Urls(store.project, store.name)
    parts = []
    if view.damage:
        parts.append(
            f'<div class="box error" role="alert">{e(view.damage)}; shown: what is readable.</div>'
        )
    if view.pending is not None:
        state = {
            "holding": "Held for review: flag what the trainer should skip, then approve (or let the hold expire).",
            "approved": "Approved: the trainer is applying the decisions in force and training it.",
            "expired": "The hold expired: the trainer is applying the decisions in force and training it.",
        }[view.pending_state]
        parts.append(
            f'<div class="box pending"><span class="badge hold">{e(view.pending_state)}</span> '
            f"{e(state)}{_approve_form(urls, view.pending, approved, reviewer)}</div>"
        )
    else:
        trained = (
            "These rollouts were trained already (into the next step): a flag or override here "
            "applies when the same trajectories (same ids) are submitted again, and records what "
            "a reviewer found."
            if view.split == "train"
            else "Logged for evaluation (not trained): a flag or override here applies if the "
            "same trajectories (same ids) are submitted for training."
        )
        parts.append(f'<p class="muted">{trained}</p>{metrics_grid(view.metrics)}')
    strip = [(g.index, [(t.reward, t.flagged) for t in g.trajectories]) for g in view.groups]
    parts.append(f'<div class="plots">{reward_strip(strip)}</div>')
    parts.append(filter_form(urls.step(view.split, view.step), query, with_split=False, splits=[]))
    total = sum(len(g.trajectories) for g in view.groups)
    matched = sum(len(g.trajectories) for g in shown)
    if any(query.values()):
        parts.append(f'<p class="muted">{matched} of {total} trajectories match.</p>')
    parts.append(f"<h2>Groups ({len(shown)})</h2>")
    for group in shown:
        rewards = [t.reward for t in group.trajectories]
        summary = (
            f"{len(group.trajectories)} trajectories, rewards {number(min(rewards))} to {number(max(rewards))}"
            if rewards
            else "no trajectories"
        )
        flag = '<span class="badge flag">group flagged</span>' if group.flag else ""
        errors = (
            f'<span class="badge">{len(group.exceptions)} exceptions</span>'
            if group.exceptions
            else ""
        )
        scenario = next(
            (
                message_text(m)
                for t in group.trajectories[:1]
                for m in t.messages()
                if m.get("role") == "user"
            ),
            "",
        )
        chips = "".join(
            f'<a class="{"flagged" if t.flagged else ""}" title="{e(t.id)}" '
            f'href="{e(urls.trajectory(view.split, view.step, t.id))}">{number(t.reward, 3)}</a>'
            for t in group.trajectories
        )
        parts.append(
            f'<div class="box group{" flagged" if group.flag else ""}" data-group="{group.index}">'
            f'<a href="{e(urls.group(view.split, view.step, group.index))}"><b>Group {group.index}</b></a> '
            f'· {summary}{flag}{errors}<div class="muted">{e(scenario[:200])}</div>'
            f'<div class="chips">{chips}</div></div>'
        )
    crumbs = _crumbs(store, (view.label, None))
    return page(f"{store.project}/{store.name} · {view.label}", crumbs, "".join(parts))


def group_page(store: ModelStore, view: StepView, group: GroupView, reviewer: Reviewer) -> str:
    urls = Urls(store.project, store.name)
    parts = []
    if group.flag:
        by = f" by {e(group.flag.get('who'))}" if group.flag.get("who") else ""
        parts.append(
            f'<div class="box flagged">Group flagged{by} at {e(when(group.flag["at"]))}: '
            f"{e(group.flag.get('reason'))}</div>"
        )
    parts.append(
        group_forms(group.index, group.flag is not None, urls, view.split, view.step, reviewer)
    )
    for exception in group.exceptions:
        parts.append(f'<div class="box error"><b>exception</b><pre>{e(exception)}</pre></div>')
    cards = "".join(
        trajectory_card(t, urls, view.split, view.step, reviewer, rank=rank)
        for rank, t in enumerate(group.trajectories, start=1)
    )
    parts.append(
        f"<h2>{len(group.trajectories)} trajectories, best reward first</h2>"
        f'<div class="columns">{cards}</div>'
    )
    crumbs = _crumbs(
        store, (view.label, urls.step(view.split, view.step)), (f"group {group.index}", None)
    )
    return page(f"Group {group.index} · {view.label}", crumbs, "".join(parts))


def trajectory_page(
    store: ModelStore, view: StepView, trajectory: TrajectoryView, reviewer: Reviewer
) -> str:
    urls = Urls(store.project, store.name)
    card = trajectory_card(trajectory, urls, view.split, view.step, reviewer)
    crumbs = _crumbs(
        store,
        (view.label, urls.step(view.split, view.step)),
        (f"group {trajectory.group}", urls.group(view.split, view.step, trajectory.group)),
        (trajectory.id, None),
    )
    return page(f"Trajectory {trajectory.id}", crumbs, card)


def search_page(
    store: ModelStore,
    results: list[tuple[str, str, TrajectoryView]],
    query: dict[str, str],
    splits: list[str],
    truncated: bool,
    damaged: list[str] | None = None,
) -> str:
    urls = Urls(store.project, store.name)
    parts = [filter_form(urls.search(), query, with_split=True, splits=splits)]
    if damaged:
        parts.append(
            '<div class="box error" role="alert">Damaged trajectories files (a crash while they '
            f"were written?): {e(', '.join(damaged))}. Searched as far as they are readable.</div>"
        )
    note = f" (the first {SEARCH_LIMIT}: narrow the filters)" if truncated else ""
    parts.append(f"<p>{len(results)} trajectories match{note}.</p>")
    rows = []
    for split, step, trajectory in results:
        first_user = next(
            (message_text(m) for m in trajectory.messages() if m.get("role") == "user"), ""
        )
        snippet = first_user[:160] + ("…" if len(first_user) > 160 else "")
        rows.append(
            f"<tr><td>{e(split)}</td><td>{e(step)}</td><td>"
            f'<a href="{e(urls.group(split, step, trajectory.group))}">{trajectory.group}</a></td>'
            f'<td><a href="{e(urls.trajectory(split, step, trajectory.id))}">{e(trajectory.id)}</a>'
            f'{badges(trajectory)}</td><td class="num">{reward_text(trajectory)}</td>'
            f'<td class="num">{number(trajectory.advantage)}</td>'
            f"<td>{e(snippet)}</td></tr>"
        )
    if rows:
        parts.append(
            "<table><tr><th>split</th><th>step</th><th>group</th><th>trajectory</th><th>reward</th>"
            f"<th>advantage</th><th>first user message</th></tr>{''.join(rows)}</table>"
        )
    return page(
        f"Search {store.project}/{store.name}", _crumbs(store, ("search", None)), "".join(parts)
    )


def error_page(status: int, message: str) -> str:
    body = f'<div class="box error" role="alert"><b>{status}</b> {e(message)}</div>'
    return page("Review: error", _crumbs(), body)
