"""HTML building blocks of the review page: layout, links, conversations, trajectory cards, forms.

Plain f-strings; every value that comes from the store or the request goes through `e()`
(html.escape, quotes included). The pages themselves are in `_review_pages.py`.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from art_backend.review._browse import PENDING, TrajectoryView, message_text

PREFIX = "/review"
CSRF_FIELD = "csrf_token"


@dataclass(frozen=True)
class Reviewer:
    """Who fills the forms: the name they last gave and, in a key login session, the CSRF token."""

    who: str = ""
    csrf_token: str = ""

    def fields(self) -> str:
        """The inputs every decision form ends with: the token (hidden) and the reviewer's name."""
        token = (
            f'<input type="hidden" name="{CSRF_FIELD}" value="{e(self.csrf_token)}">'
            if self.csrf_token
            else ""
        )
        return f'{token}<input name="who" placeholder="your name" value="{e(self.who)}" size="9">'


STYLE = """
*{box-sizing:border-box}body{font:14px/1.45 system-ui,-apple-system,sans-serif;margin:0;color:#1f2328;background:#f6f7f9}
header{background:#1f2937;color:#fff;padding:.55rem 1.2rem}header a{color:#cbd5e1;text-decoration:none}
header a:hover{color:#fff}main{padding:1rem 1.2rem;max-width:1500px}h1{font-size:1.35rem;margin:.2rem 0 .8rem}
h2{font-size:1.05rem;margin:1.3rem 0 .5rem}a{color:#1d4ed8}table{border-collapse:collapse;background:#fff}
td,th{border:1px solid #e5e7eb;padding:.25rem .5rem;text-align:left;vertical-align:top}th{background:#f3f4f6}
.num{text-align:right;font-variant-numeric:tabular-nums}.muted{color:#6b7280}.box{background:#fff;border:1px solid #e5e7eb;border-radius:6px;padding:.7rem .9rem;margin:.6rem 0}
.pending{border-color:#f59e0b;background:#fffbeb}.flagged{border-color:#dc2626!important;background:#fef2f2}
.badge{display:inline-block;border-radius:9px;padding:0 .45rem;font-size:.78rem;background:#e5e7eb;margin-left:.25rem}
.badge.flag{background:#dc2626;color:#fff}.badge.override{background:#7c3aed;color:#fff}.badge.hold{background:#f59e0b;color:#fff}
.plots{display:flex;flex-wrap:wrap;gap:.5rem}.plot{background:#fff;border:1px solid #e5e7eb;border-radius:4px}
.plot .t{font-size:12px;font-weight:600}.plot .ax{stroke:#9ca3af}.plot .g{stroke:#f1f5f9}.plot text{font-size:10px;fill:#4b5563}
.plot .yl{text-anchor:end}.plot .xl{text-anchor:middle}.plot .xn,.plot .lg{text-anchor:end}
.columns{display:grid;grid-auto-flow:column;grid-auto-columns:minmax(285px,1fr);gap:.7rem;overflow-x:auto;align-items:start}
.card{background:#fff;border:1px solid #d1d5db;border-radius:6px;padding:.6rem .7rem}.card h3{font-size:.95rem;margin:0 0 .3rem}
.msg{border-left:3px solid #cbd5e1;padding:.2rem .5rem;margin:.35rem 0;background:#fafafa}.msg .role{font-size:.75rem;font-weight:600;text-transform:uppercase;color:#6b7280}
.msg.assistant{border-color:#2563eb}.msg.tool{border-color:#059669}.msg.system{border-color:#9ca3af}.msg.user{border-color:#d97706}
.text{white-space:pre-wrap;word-break:break-word}.call{background:#ecfdf5;border:1px solid #a7f3d0;border-radius:4px;padding:.2rem .4rem;margin:.25rem 0}
pre{white-space:pre-wrap;word-break:break-word;margin:.2rem 0;font-size:.85rem}.judge{background:#eff6ff;border:1px solid #bfdbfe;border-radius:4px;padding:.3rem .5rem}
form.inline{display:flex;gap:.35rem;flex-wrap:wrap;align-items:center;margin:.3rem 0}input,select,button{font:inherit;padding:.2rem .4rem}
input[name=reason]{flex:1;min-width:10rem}button{cursor:pointer}.chips a{display:inline-block;margin:.1rem;padding:.05rem .4rem;border-radius:4px;background:#dbeafe;text-decoration:none;color:#1e3a8a;font-variant-numeric:tabular-nums}
.chips a.flagged{background:#fee2e2;color:#991b1b;border:1px solid #dc2626}.filters{display:flex;flex-wrap:wrap;gap:.4rem;align-items:end}
.filters label{display:flex;flex-direction:column;font-size:.8rem;color:#4b5563}.filters input{width:7rem}.filters input[name=q]{width:14rem}
.error{border-color:#dc2626;background:#fef2f2}.metrics{display:grid;grid-template-columns:repeat(auto-fill,minmax(250px,1fr));gap:0 1rem}
.metrics div{display:flex;justify-content:space-between;border-bottom:1px dotted #e5e7eb}
"""


def e(value: Any) -> str:
    """Escape anything for HTML text or a quoted attribute."""
    return escape("" if value is None else str(value), quote=True)


def page(title: str, crumbs: list[tuple[str, str | None]], body: str) -> str:
    """A whole page: breadcrumbs in the header, then the body."""
    trail = " / ".join(
        f'<a href="{e(href)}">{e(label)}</a>' if href else e(label) for label, href in crumbs
    )
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{STYLE}</style>'
        f"</head><body><header>{trail}</header><main><h1>{e(title)}</h1>{body}</main></body></html>"
    )


def number(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "—"
    return f"{value:.{digits}g}"


def when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


class Urls:
    """Links of one model's review pages (every part quoted)."""

    def __init__(self, project: str, name: str) -> None:
        self.model = f"{PREFIX}/{quote(project, safe='')}/{quote(name, safe='')}/"

    def step(self, split: str, step: str, query: dict[str, str] | None = None) -> str:
        url = f"{self.model}steps/{quote(split, safe='')}/{quote(step, safe='')}"
        return url + (f"?{urlencode(query)}" if query else "")

    def group(self, split: str, step: str, group: int) -> str:
        return f"{self.step(split, step)}/groups/{group}"

    def trajectory(self, split: str, step: str, trajectory_id: str) -> str:
        return f"{self.step(split, step)}/trajectories/{quote(trajectory_id, safe='')}"

    def decisions(self, split: str, step: str) -> str:
        return f"{self.step(split, step)}/decisions"

    def approve(self, pending_id: str) -> str:
        return f"{self.model}pending/{quote(pending_id, safe='')}/approve"

    def search(self, query: dict[str, str] | None = None) -> str:
        return f"{self.model}search" + (f"?{urlencode(query)}" if query else "")


# ------------------------------------------------------------------------------ conversations


def conversation(messages: list[dict[str, Any]]) -> str:
    """Messages in order: role, text, tool calls with their arguments, tool results."""
    blocks = []
    for message in messages:
        role = str(message.get("role", "?"))
        label = role
        if role == "tool":
            label += f" result · {message.get('name') or message.get('tool_call_id') or ''}"
        content = message_text({"content": message.get("content")})
        calls = "".join(_tool_call(call) for call in message.get("tool_calls") or [])
        blocks.append(
            f'<div class="msg {e(role)}"><div class="role">{e(label)}</div>'
            f'<div class="text">{e(content)}</div>{calls}</div>'
        )
    return "".join(blocks) or '<p class="muted">no messages</p>'


def _tool_call(call: Any) -> str:
    function = call.get("function", {}) if isinstance(call, dict) else {}
    arguments = function.get("arguments", "")
    with contextlib.suppress(TypeError, ValueError):
        arguments = json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    call_id = call.get("id", "") if isinstance(call, dict) else ""
    return (
        f'<div class="call"><b>tool call</b> {e(function.get("name", "?"))} '
        f'<span class="muted">{e(call_id)}</span><pre>{e(arguments)}</pre></div>'
    )


# ---------------------------------------------------------------------------- trajectory card


def badges(trajectory: TrajectoryView) -> str:
    out = ""
    if trajectory.flag:
        out += '<span class="badge flag">flagged</span>'
    if trajectory.group_flag:
        out += '<span class="badge flag">group flagged</span>'
    if trajectory.override:
        out += '<span class="badge override">reward overridden</span>'
    applied = trajectory.row.get("review")
    if isinstance(applied, dict):
        out += f'<span class="badge">trainer applied: {e(applied.get("applied"))}</span>'
    return out


def reward_text(trajectory: TrajectoryView) -> str:
    if trajectory.override:
        return f"{number(trajectory.logged_reward)} → <b>{number(trajectory.reward)}</b>"
    return f"<b>{number(trajectory.reward)}</b>"


def short_id(trajectory_id: str) -> str:
    """Long ids (uuid4 hex) cut to 12 characters for display; the link and title keep all."""
    return trajectory_id if len(trajectory_id) <= 16 else trajectory_id[:12] + "…"


def advantage_text(trajectory: TrajectoryView, split: str) -> str:
    if trajectory.advantage is not None:
        return f"advantage {number(trajectory.advantage)}"
    if split == PENDING:
        return '<span class="muted">advantage after review</span>'
    reason = "not trained" if split == "train" else "logged, not trained"
    return f'<span class="muted">{reason}</span>'


def trajectory_card(
    trajectory: TrajectoryView,
    urls: Urls,
    split: str,
    step: str,
    reviewer: Reviewer,
    *,
    rank: int | None = None,
) -> str:
    """Everything about one trajectory, with the forms to flag it or override its reward."""
    flagged = " flagged" if trajectory.flagged else ""
    title = f"#{rank} · " if rank is not None else ""
    link = urls.trajectory(split, step, trajectory.id)
    parts = [
        f'<div class="card{flagged}" data-trajectory="{e(trajectory.id)}">',
        f"<h3>{title}reward {reward_text(trajectory)} · {advantage_text(trajectory, split)}"
        f"{badges(trajectory)}</h3>",
        f'<div class="muted">id <a href="{e(link)}" title="{e(trajectory.id)}">{e(short_id(trajectory.id))}</a>'
        f" · group {trajectory.group}</div>",
        decisions_in_force(trajectory),
    ]
    histories = trajectory.row.get("histories", [])
    for number_, history in enumerate(histories):
        if number_:
            parts.append(f"<h4>additional history {number_}</h4>")
        parts.append(conversation(history.get("messages", [])))
    parts.append(logs(trajectory.row.get("logs", [])))
    metrics = trajectory.row.get("metrics") or {}
    if metrics:
        rows = "".join(
            f'<tr><td>{e(k)}</td><td class="num">{number(v)}</td></tr>'
            for k, v in sorted(metrics.items())
        )
        parts.append(f"<details open><summary>metrics</summary><table>{rows}</table></details>")
    if trajectory.row.get("metadata"):
        metadata = json.dumps(trajectory.row["metadata"], indent=2, ensure_ascii=False, default=str)
        parts.append(f"<details><summary>metadata</summary><pre>{e(metadata)}</pre></details>")
    parts.append(trajectory_forms(trajectory, urls, split, step, reviewer))
    parts.append("</div>")
    return "".join(parts)


def decisions_in_force(trajectory: TrajectoryView) -> str:
    lines = []
    for label, row in (
        ("Flagged", trajectory.flag),
        ("Group flagged", trajectory.group_flag),
        ("Reward overridden", trajectory.override),
    ):
        if row:
            by = f" by {e(row.get('who'))}" if row.get("who") else ""
            by += " in Langfuse" if row.get("source") == "langfuse" else ""
            lines.append(
                f'<div class="decision">{label}{by} at {e(when(row["at"]))}: {e(row.get("reason"))}</div>'
            )
    return "".join(lines)


def logs(lines: list[Any]) -> str:
    """The trajectory's logs; a judge's explanation ("RULER: ...") is set apart."""
    if not lines:
        return ""
    judged = [str(line) for line in lines if str(line).startswith("RULER:")]
    other = [str(line) for line in lines if not str(line).startswith("RULER:")]
    out = "".join(
        f'<div class="judge"><b>judge</b> {e(line.removeprefix("RULER:").strip())}</div>'
        for line in judged
    )
    if other:
        out += f"<details open><summary>logs</summary><pre>{e(chr(10).join(other))}</pre></details>"
    return out


def trajectory_forms(
    trajectory: TrajectoryView, urls: Urls, split: str, step: str, reviewer: Reviewer
) -> str:
    action = e(urls.decisions(split, step))
    hidden = (
        f'<input type="hidden" name="trajectory_id" value="{e(trajectory.id)}">'
        f'<input type="hidden" name="next" value="{e(urls.trajectory(split, step, trajectory.id))}">'
    )
    fields = reviewer.fields()
    forms = [
        f'<form class="inline flag-trajectory" method="post" action="{action}">{hidden}'
        '<input type="hidden" name="action" value="flag_trajectory">'
        f'<input name="reason" placeholder="why should the trainer skip it?" required>{fields}'
        "<button>Flag trajectory</button></form>",
        f'<form class="inline override-reward" method="post" action="{action}">{hidden}'
        '<input type="hidden" name="action" value="override_reward">'
        '<input name="reward" placeholder="reward" size="6" required>'
        f'<input name="reason" placeholder="why this reward?" required>{fields}'
        "<button>Override reward</button></form>",
    ]
    if trajectory.flag or trajectory.override:
        forms.append(
            f'<form class="inline withdraw-trajectory" method="post" action="{action}">{hidden}'
            '<input type="hidden" name="action" value="withdraw_trajectory">'
            f'<input name="reason" placeholder="why withdraw?" required>{fields}'
            "<button>Withdraw flag/override</button></form>"
        )
    return '<details class="forms" open><summary>review</summary>' + "".join(forms) + "</details>"


def group_forms(
    group_index: int, flagged: bool, urls: Urls, split: str, step: str, reviewer: Reviewer
) -> str:
    action = e(urls.decisions(split, step))
    kind, label, placeholder = (
        ("withdraw_group", "Withdraw group flag", "why withdraw?")
        if flagged
        else ("flag_group", "Flag whole group", "why should the trainer skip this group?")
    )
    return (
        f'<form class="inline {kind.replace("_", "-")}" method="post" action="{action}">'
        f'<input type="hidden" name="action" value="{kind}">'
        f'<input type="hidden" name="group" value="{group_index}">'
        f'<input type="hidden" name="next" value="{e(urls.group(split, step, group_index))}">'
        f'<input name="reason" placeholder="{placeholder}" required>'
        f"{reviewer.fields()}<button>{label}</button></form>"
    )


def filter_form(action: str, query: dict[str, str], *, with_split: bool, splits: list[str]) -> str:
    """The filter form (GET): reward range, split, exceptions, flagged, a metric's range, text."""

    def field(name: str, label: str, placeholder: str = "") -> str:
        return (
            f'<label>{label}<input name="{name}" value="{e(query.get(name, ""))}" '
            f'placeholder="{e(placeholder)}"></label>'
        )

    split = ""
    if with_split:
        options = "".join(
            f'<option value="{e(s)}"{" selected" if query.get("split") == s else ""}>{e(s)}</option>'
            for s in ["", *splits]
        )
        split = f'<label>split<select name="split">{options}</select></label>'

    def box(name: str, label: str) -> str:
        checked = " checked" if query.get(name) else ""
        return f'<label>{label}<input type="checkbox" name="{name}" value="on"{checked}></label>'

    return (
        f'<form class="filters box" method="get" action="{e(action)}">'
        f"{field('min_reward', 'reward ≥')}{field('max_reward', 'reward ≤')}{split}"
        f"{box('exceptions', 'with exceptions')}{box('flagged', 'flagged only')}"
        f"{field('metric', 'metric', 'e.g. num_turns')}{field('metric_min', 'metric ≥')}"
        f"{field('metric_max', 'metric ≤')}{field('q', 'text contains', 'search messages and logs')}"
        f'<button>Filter</button> <a href="{e(action)}">clear</a></form>'
    )


def metrics_grid(metrics: dict[str, Any]) -> str:
    if not metrics:
        return '<p class="muted">no metrics recorded for this step</p>'
    cells = "".join(
        f'<div><span>{e(k)}</span><span class="num">{number(v)}</span></div>'
        for k, v in sorted(metrics.items())
    )
    return f'<div class="metrics box">{cells}</div>'
