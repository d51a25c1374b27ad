"""The RULER judge prompt: what is shared is sent once, each run once, long messages shortened.

Layout (pure functions, no I/O):

- identical runs are merged first: N copies of one conversation are one run for the judge;
- the messages every run starts with (system prompt, task, shared turns) go once in <context>;
- tools go once in <tools>;
- each run's remainder goes in <run id="k">, ids 1..N in presentation order;
- every message (tool results included) is cut to `message_char_budget` characters, keeping its
  head and tail around a visible `[... N characters cut ...]` marker;
- the answer schema has exactly the keys run_1..run_N, each {explanation, score}, so a
  structured-output judge cannot skip, repeat or invent an id;
- the judge writes an integer score from 0 to 100 (returned as score / 100): a bounded integer
  is a finite grammar, where a JSON number lets a weak constrained model write digits forever.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

DEFAULT_RUBRIC = """\
- A run that accomplishes the task scores clearly higher than one that does not.
- Among runs that accomplish it, prefer the one that is correct, complete and efficient: no \
needless steps, repeated calls or detours.
- A run that makes partial progress gets partial credit, in proportion to that progress.
- Keep differences proportional: near-equal runs get near-equal scores; a much better run gets a \
much higher score.
- Fabricated facts, ignored instructions and a broken format the task asked for lower a score."""

SYSTEM_PROMPT = """\
You judge the work of an AI agent. You receive one or more runs of the agent on the same task: \
first the context they all share, then what each run did. Score every run from 0 to 100 by the \
rubric (0 = worst, 100 = best). When there are several runs, compare them with each other so that the scores rank them. \
Write a short explanation (one or two sentences) before each score.

Rubric:
{rubric}"""

DEFAULT_MESSAGE_CHAR_BUDGET = 2000
MIN_MESSAGE_CHAR_BUDGET = 200
EXPLANATION_MAX_CHARS = 300
SCORE_SCALE = 100  # the judge scores 0..100; RULER returns score / SCORE_SCALE


@dataclass
class JudgePrompt:
    """The judge's messages and answer schema for the distinct runs, in presentation order."""

    messages: list[dict[str, Any]]
    schema: dict[str, Any]
    num_runs: int
    truncated_messages: int = 0
    truncated_chars: int = 0


@dataclass
class DistinctRuns:
    """Identical conversations merged: `runs[k]` is judged once; input i is `runs[index_of[i]]`."""

    runs: list[list[str]]  # each message rendered as text
    index_of: list[int]
    prefix_length: int = 0
    tool_text: list[str] = field(default_factory=list)


def shorten(text: str, budget: int) -> tuple[str, int]:
    """`text` within `budget` characters (head and tail kept, a marker between); chars cut."""
    if len(text) <= budget:
        return text, 0
    cut = len(text) - budget
    head = budget * 2 // 3
    tail = budget - head
    return f"{text[:head]}\n[... {cut} characters cut ...]\n{text[len(text) - tail :]}", cut


def render_message(message: dict[str, Any], tool_names: dict[str, str]) -> str:
    """One message as judge-readable text; tool results are labelled with their tool's name."""
    role = str(message.get("role", "?"))
    text = _content_text(message.get("content"))
    lines = []
    if role == "tool":
        name = tool_names.get(str(message.get("tool_call_id")), message.get("name") or "a tool")
        lines.append(f"tool result ({name}): {text}")
    elif text or not message.get("tool_calls"):
        lines.append(f"{role}: {text}")
    for call in message.get("tool_calls") or []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        name = function.get("name", "?")
        if isinstance(call, dict) and call.get("id"):
            tool_names[str(call["id"])] = name
        lines.append(f"{role} calls {name}({function.get('arguments', '')})")
    return "\n".join(lines)


def distinct_runs(
    message_lists: list[list[dict[str, Any]]], tools: list[dict[str, Any]] | None = None
) -> DistinctRuns:
    """Render, merge identical runs, and find the prefix all distinct runs share."""
    rendered: list[list[str]] = []
    for messages in message_lists:
        names: dict[str, str] = {}
        rendered.append([render_message(m, names) for m in messages])
    runs: list[list[str]] = []
    seen: dict[str, int] = {}
    index_of = []
    for run in rendered:
        key = json.dumps(run)
        if key not in seen:
            seen[key] = len(runs)
            runs.append(run)
        index_of.append(seen[key])
    if len(runs) == 1:
        # One run is scored on its own: its task goes in the context, its answers in the run.
        prefix = 0
        while prefix < len(runs[0]) and not runs[0][prefix].startswith("assistant"):
            prefix += 1
    else:
        prefix = min(len(run) for run in runs)
        for position in range(prefix):
            if any(run[position] != runs[0][position] for run in runs[1:]):
                prefix = position
                break
    tool_text = [_render_tool(tool) for tool in tools or []]
    return DistinctRuns(runs, index_of, prefix, tool_text)


def build_judge_prompt(
    distinct: DistinctRuns,
    *,
    rubric: str = DEFAULT_RUBRIC,
    order: list[int] | None = None,
    message_char_budget: int = DEFAULT_MESSAGE_CHAR_BUDGET,
) -> JudgePrompt:
    """The prompt for the distinct runs, shown in `order` (default: as given), as ids 1..N."""
    order = list(range(len(distinct.runs))) if order is None else order
    cuts: list[int] = []

    def fit(text: str) -> str:
        short, cut = shorten(text, message_char_budget)
        if cut:
            cuts.append(cut)
        return short

    sections = []
    context = distinct.runs[0][: distinct.prefix_length]
    if context:
        sections.append("<context>\n" + "\n\n".join(fit(m) for m in context) + "\n</context>")
    if distinct.tool_text:
        sections.append("<tools>\n" + "\n".join(fit(t) for t in distinct.tool_text) + "\n</tools>")
    for run_id, index in enumerate(order, start=1):
        remainder = distinct.runs[index][distinct.prefix_length :]
        body = "\n\n".join(fit(m) for m in remainder) or "(nothing after the shared context)"
        sections.append(f'<run id="{run_id}">\n{body}\n</run>')
    count = len(order)
    keys = ", ".join(f'"run_{k}"' for k in range(1, count + 1))
    sections.append(
        f"Score exactly {count} run{'s' if count > 1 else ''}, ids {_id_list(count)}. Answer with "
        f"one JSON object with exactly the keys {keys}; each value is "
        '{"explanation": "<one or two sentences>", "score": <an integer from 0 to 100>}.'
    )
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT.format(rubric=rubric.strip())},
        {"role": "user", "content": "\n\n".join(sections)},
    ]
    return JudgePrompt(messages, answer_schema(count), count, len(cuts), sum(cuts))


def answer_schema(count: int) -> dict[str, Any]:
    """run_1..run_count, all required, nothing else: the ids cannot be wrong under the schema."""
    item = {
        "type": "object",
        "properties": {
            "explanation": {"type": "string", "maxLength": EXPLANATION_MAX_CHARS},
            "score": {"type": "integer", "minimum": 0, "maximum": SCORE_SCALE},
        },
        "required": ["explanation", "score"],
        "additionalProperties": False,
    }
    keys = [f"run_{k}" for k in range(1, count + 1)]
    return {
        "type": "object",
        "properties": {key: item for key in keys},
        "required": keys,
        "additionalProperties": False,
    }


def _id_list(count: int) -> str:
    if count <= 3:
        return ", ".join(str(k) for k in range(1, count + 1))
    return f"1, 2, ..., {count}"


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, dict):
                parts.append(f"[{part.get('type', 'part')}]")
            else:
                parts.append(str(part))
        return "\n".join(parts)
    return str(content)


def _render_tool(tool: dict[str, Any]) -> str:
    function = tool.get("function", tool)
    parameters = json.dumps(function.get("parameters", {}), separators=(",", ":"))
    description = function.get("description") or ""
    return f"- {function.get('name', '?')}{parameters}: {description}".rstrip(": ")
