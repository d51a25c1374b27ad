"""The behaviour diff page: pick two steps, see the counts per tag, filter, read both answers.

`/review/<project>/<name>/diff?from=N&to=M[&split=val][&tag=newly_wrong][&q=text]
[&metric=correct][&threshold=0][&length_margin=0.5]`; the comparison itself is `_diff`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from art_backend._errors import InvalidRequestError
from art_backend.review._browse import message_text
from art_backend.review._diff import (
    TAG_FILTERS,
    TAGS,
    Answer,
    CorrectnessRule,
    DiffOptions,
    ExampleDiff,
    StepDiff,
)
from art_backend.review._filters import query_number
from art_backend.review._html import PREFIX, Urls, conversation, e, number, page
from art_backend.store._checkpoints import ModelStore
from art_core.names import is_split

DIFF_FIELDS = (
    "from", "to", "split", "tag", "q", "metric", "threshold", "length_margin", "format",
)  # fmt: skip
FORMATS = ("html", "json")  # `format`: the page, or its answer as JSON (`wants_json`)
EXTRA_STYLE = """<style>
.counts{display:flex;flex-wrap:wrap;gap:.4rem}.counts a{display:block;padding:.3rem .6rem;border:1px solid #d1d5db;border-radius:6px;background:#fff;text-decoration:none;color:#1f2328}
.counts a b{font-size:1.2rem;display:block;font-variant-numeric:tabular-nums}.counts a.on{border-color:#1d4ed8;background:#eff6ff}
.pair{display:grid;grid-template-columns:1fr 1fr;gap:.7rem;align-items:start}.tag{background:#e0e7ff;color:#3730a3}
.tag.newly_right{background:#dcfce7;color:#166534}.tag.newly_wrong{background:#fee2e2;color:#991b1b}
.right{color:#166534;font-weight:600}.wrong{color:#991b1b;font-weight:600}
</style>"""


@dataclass(frozen=True)
class DiffQuery:
    """What the diff page's query asks for; `from_step`/`to_step` None: only the picker."""

    split: str = "val"
    from_step: int | None = None
    to_step: int | None = None
    tag: str = ""
    text: str = ""
    options: DiffOptions = field(default_factory=DiffOptions)

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> DiffQuery:
        """The page's query; an unknown field or a bad number is a 400 naming it."""
        for name in query:
            if name not in DIFF_FIELDS:
                raise InvalidRequestError(
                    f"Unknown field {name!r}: the diff page takes {', '.join(DIFF_FIELDS)}.",
                    param=name,
                )
        split = query.get("split") or "val"
        if not is_split(split):
            raise InvalidRequestError(f"Invalid split {split!r}.", param="split")
        from_step, to_step = _step(query, "from"), _step(query, "to")
        if (from_step is None) != (to_step is None):
            raise InvalidRequestError(
                "Give both `from` and `to` (the two steps to compare), or neither.",
                param="to" if to_step is None else "from",
            )
        threshold = query_number(query, "threshold")
        length_margin = query_number(query, "length_margin")
        options = DiffOptions(
            rule=CorrectnessRule(
                metric=query.get("metric", "").strip() or None,
                threshold=0.0 if threshold is None else threshold,
            ),
            length_margin=DiffOptions.length_margin if length_margin is None else length_margin,
        )
        if query.get("format", "html") not in FORMATS:
            raise InvalidRequestError(
                f"Unknown format {query['format']!r}: use json (the diff as JSON, as "
                "`Accept: application/json` asks) or html (the page).",
                param="format",
            )
        tag = query.get("tag", "")
        if tag and tag not in TAG_FILTERS:
            raise InvalidRequestError(
                f"Unknown tag {tag!r}: use one of {', '.join(TAG_FILTERS)}.", param="tag"
            )
        return cls(split, from_step, to_step, tag, query.get("q", ""), options)


def _step(query: Mapping[str, str], name: str) -> int | None:
    text = query.get(name, "").strip()
    if not text:
        return None
    if not (text.isascii() and text.isdigit() and len(text) <= 9):
        raise InvalidRequestError(f"`{name}` must be a step number, got {text!r}.", param=name)
    return int(text)


def diff_url(store: ModelStore, query: Mapping[str, Any]) -> str:
    kept = {k: str(v) for k, v in query.items() if v not in (None, "")}
    return f"{Urls(store.project, store.name).model}diff" + (f"?{urlencode(kept)}" if kept else "")


# ------------------------------------------------------------------------------------ the page


def diff_page(
    store: ModelStore,
    query: Mapping[str, str],
    wanted: DiffQuery,
    steps_by_split: dict[str, list[int]],
    diff: StepDiff | None,
    shown: list[ExampleDiff],
) -> str:
    """The picker, and with a diff: the counts (links that filter), then each example's pair."""
    parts = [EXTRA_STYLE, _picker(store, query, wanted, steps_by_split)]
    if diff is None:
        if not any(len(steps) >= 2 for steps in steps_by_split.values()):
            parts.append(
                '<p class="box muted">No split has logged trajectories at two steps yet: log '
                "the same held-out examples at each step with <code>await model.log(groups, "
                'split="val")</code>, then compare two of them here.</p>'
            )
        return _page(store, "Behaviour diff", parts)
    rule = diff.options.rule.describe()
    leftovers = (
        f" · {diff.only_before} only at step {diff.from_step}, {diff.only_after} only at step "
        f"{diff.to_step} (not compared)"
        if diff.only_before or diff.only_after
        else ""
    )
    parts.append(
        f'<p class="summary">{e(diff.split)}: step {diff.from_step} → step {diff.to_step} · '
        f"<b>{len(diff.examples)}</b> examples compared · right means <code>{e(rule)}</code>"
        f"{e(leftovers)}</p>"
    )
    parts.append(_counts(store, query, diff, wanted.tag))
    parts.append(f'<p class="muted shown">{len(shown)} of {len(diff.examples)} examples shown.</p>')
    parts.extend(_example(diff, example) for example in shown)
    title = f"Behaviour diff · {diff.split} step {diff.from_step} → {diff.to_step}"
    return _page(store, title, parts)


def _page(store: ModelStore, title: str, parts: list[str]) -> str:
    crumbs: list[tuple[str, str | None]] = [
        ("review", f"{PREFIX}/"),
        (f"{store.project}/{store.name}", Urls(store.project, store.name).model),
        ("diff", None),
    ]
    return page(title, crumbs, "".join(parts))


def _picker(
    store: ModelStore, query: Mapping[str, str], wanted: DiffQuery, steps: dict[str, list[int]]
) -> str:
    """The GET form: split, the two steps, the correctness rule, the tag filter, text."""
    split_steps = steps.get(wanted.split, [])
    default_from = wanted.from_step if wanted.from_step is not None else next(iter(split_steps), 0)
    default_to = wanted.to_step if wanted.to_step is not None else (split_steps or [0])[-1]

    def options(values: list[str], selected: str, labels: dict[str, str] | None = None) -> str:
        return "".join(
            f'<option value="{e(v)}"{" selected" if v == selected else ""}>'
            f"{e((labels or {}).get(v, v))}</option>"
            for v in values
        )

    def steps_select(name: str, selected: int) -> str:
        values = [str(s) for s in split_steps] or [str(selected)]
        return (
            f'<label>{name}<select name="{name}">{options(values, str(selected))}</select></label>'
        )

    def text_field(name: str, label: str, placeholder: str = "") -> str:
        return (
            f'<label>{label}<input name="{name}" value="{e(query.get(name, ""))}" '
            f'placeholder="{e(placeholder)}"></label>'
        )

    splits = sorted(steps) or [wanted.split]
    tag_labels = {"": "all", **TAGS, "changed": "any change", "unchanged": "unchanged"}
    return (
        f'<form class="filters box diff-picker" method="get" action="{e(diff_url(store, {}))}">'
        f'<label>split<select name="split">{options(splits, wanted.split)}</select></label>'
        f"{steps_select('from', default_from)}{steps_select('to', default_to)}"
        f"{text_field('metric', 'right when metric', 'reward')}"
        f"{text_field('threshold', 'is above', '0')}"
        f"{text_field('length_margin', 'length margin', '0.5')}"
        f'<label>show<select name="tag">{options(list(tag_labels), wanted.tag, tag_labels)}'
        "</select></label>"
        f"{text_field('q', 'text contains', 'prompt or answers')}"
        "<button>Compare</button></form>"
    )


def _counts(store: ModelStore, query: Mapping[str, str], diff: StepDiff, active: str) -> str:
    """One box per tag with its count; each is a link that shows only those examples."""
    counts = diff.counts
    cells = [("", "compared", len(diff.examples))]
    cells += [(tag, label, counts[tag]) for tag, label in TAGS.items()]
    cells += [
        ("changed", "any change", counts["changed"]),
        ("unchanged", "unchanged", counts["unchanged"]),
    ]
    links = "".join(
        f'<a class="count{" on" if tag == active else ""}" data-tag="{e(tag or "all")}" '
        f'href="{e(diff_url(store, {**query, "tag": tag}))}"><b>{count}</b>{e(label)}</a>'
        for tag, label, count in cells
    )
    return f'<div class="counts">{links}</div>'


def _example(diff: StepDiff, example: ExampleDiff) -> str:
    tags = "".join(f'<span class="badge tag {e(t)}">{e(TAGS[t])}</span>' for t in example.tags)
    tags = tags or '<span class="badge">unchanged</span>'
    user = [message_text(m) for m in example.prompt if m.get("role") == "user"]
    title = user[-1] if user else example.key
    key = (
        "matched by its prompt"
        if example.key_kind == "prompt"
        else f"matched by {example.key_kind}: {example.key[:200]}"
    )
    if example.sample:
        key += f" · sample {example.sample + 1}"
    return (
        f'<div class="box example" data-tags="{e(" ".join(example.tags))}">'
        f"<div><b>{e(title[:300])}</b>{tags}</div>"
        f'<div class="muted">{e(key)}</div>'
        f"<details><summary>prompt</summary>{conversation(example.prompt)}</details>"
        f'<div class="pair">{_answer(diff.from_step, example.before, "before")}'
        f"{_answer(diff.to_step, example.after, 'after')}</div></div>"
    )


def _answer(step: int, answer: Answer, side: str) -> str:
    verdict = (
        "not judged"
        if answer.right is None
        else (
            '<span class="right">right</span>'
            if answer.right
            else '<span class="wrong">wrong</span>'
        )
    )
    tools = ", ".join(answer.tools) or "none"
    plural = "" if answer.length == 1 else "s"
    return (
        f'<div class="card answer {side}" data-trajectory="{e(answer.trajectory_id)}">'
        f"<h3>step {step} · reward {number(answer.reward)} · "
        f"{verdict}</h3>"
        f'<div class="muted">{e(answer.format)} · {answer.length} character{plural} · tools: '
        f"{e(tools)}</div>{conversation(answer.messages)}</div>"
    )
