"""Scenarios with checkable answers, and the code reward that checks them.

A scenario file is JSONL, one scenario a line::

    {"task": "How many units of COF-003 are in stock?", "answer": 3,
     "tool_calls": [{"name": "get_item", "arguments": {"sku": "COF-003"}}]}

- `task` (required): what the user asks the agent.
- `answer`: a string, a number, or a list of them; each must appear in the agent's final answer
  (its `complete_task` summary, else its last message). Strings match case-insensitively as
  text; numbers match any number written in the answer (22 matches "$22.00", not "COF-022").
- `tool_calls`: tool names, or {"name", "arguments"} objects; the run must have made each call
  (the arguments given must match, strings case-insensitively; others may be added).
- `difficulty` (optional, 1-10, default 1).

A line needs `task` and at least one of `answer` / `tool_calls`. A `tool_calls` name is the
name the model calls (`McpTool.openai_name`); one the agent is not offered (`allowed_tools`,
`--tools`) fails the run early (`check_offered_tools`): that check could never pass. The reward of a run is the
share of those checks it passes (0..1), so partial progress (the right tool, a wrong answer)
is told apart from nothing. In Python, `check(scenario, trajectory) -> float` (sync or async)
replaces it.
"""

from __future__ import annotations

import inspect
import json
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

import art_core as art
from art_core.utils import jsonl_lines
from art_mcp._errors import McpConfigError, McpScenarioFileError, McpScenarioToolsError
from art_mcp._tools import McpTool

Check = Callable[[art.Scenario, art.Trajectory], "float | Awaitable[float]"]

SCENARIO_KEYS = ("task", "answer", "tool_calls", "difficulty")
# A number not glued to letters, digits or a dash: "22" in "$22.00", none in "COF-022".
_NUMBER = re.compile(r"(?<![\w.\-])-?\d[\d,]*(?:\.\d+)?(?![\w])")


class CheckedScenario(art.Scenario):
    """A scenario with what a correct run must do: `answer` items in the final answer and
    `tool_calls` it must make (see the module doc)."""

    answer: list[str | float] = Field(default_factory=list)
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def checkable(self) -> bool:
        """Whether there is anything to check."""
        return bool(self.answer or self.tool_calls)


def load_scenarios(path: str | Path) -> list[CheckedScenario]:
    """The scenarios of a JSONL file (module doc). Every line is checked before any is used; a
    bad one raises `McpScenarioFileError` naming the file, the line and the field."""
    path = Path(path)

    def fail(message: str, line: int | None) -> McpScenarioFileError:
        return McpScenarioFileError(message, path=str(path), line=line)

    scenarios = [
        scenario_of(data, text, str(path), number)
        for number, text, data in jsonl_lines(path, fail, what="scenario file")
    ]
    if not scenarios:
        raise McpScenarioFileError(f"{path} has no scenarios (no non-blank line)", path=str(path))
    return scenarios


def parse_scenario(text: str, path: str = "<scenario>", line: int = 1) -> CheckedScenario:
    """One line of a scenario file as a `CheckedScenario`; `McpScenarioFileError` if bad."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise McpScenarioFileError(
            f"{path}, line {line}: not JSON ({error.msg} at column {error.colno})",
            path=path,
            line=line,
        ) from None
    return scenario_of(data, text, path, line)


def scenario_of(data: Any, text: str, path: str, line: int) -> CheckedScenario:
    """A parsed line of a scenario file as a `CheckedScenario`; `McpScenarioFileError` if bad."""

    def bad(problem: str, field: str | None = None) -> McpScenarioFileError:
        where = f"{path}, line {line}" + (f", field {field!r}" if field else "")
        return McpScenarioFileError(f"{where}: {problem}", path=path, line=line, field=field)

    if not isinstance(data, dict):
        raise bad(f'expected an object like {{"task": "...", "answer": "..."}}, got {text[:60]!r}')
    if unknown := sorted(set(data) - set(SCENARIO_KEYS)):
        raise bad(f"unknown key(s) {unknown}; known keys: {', '.join(SCENARIO_KEYS)}", unknown[0])
    task = data.get("task")
    if not isinstance(task, str) or not task.strip():
        raise bad("required: the task as a non-empty string", "task")
    answer = data.get("answer", [])
    answers = answer if isinstance(answer, list) else [answer]
    for item in answers:
        if isinstance(item, bool) or not isinstance(item, str | int | float) or item == "":
            raise bad(
                f"must be a string, a number or a list of them, got {json.dumps(item)}", "answer"
            )
    calls = data.get("tool_calls", [])
    if not isinstance(calls, list):
        raise bad('must be a list of tool names or {"name": ..., "arguments": {...}}', "tool_calls")
    normalized = []
    for index, call in enumerate(calls):
        if isinstance(call, str):
            call = {"name": call}
        if (
            not isinstance(call, dict)
            or not isinstance(call.get("name"), str)
            or set(call) - {"name", "arguments"}
            or not isinstance(call.get("arguments", {}), dict)
        ):
            raise bad(
                f'[{index}] must be a tool name or {{"name": "...", "arguments": {{...}}}}, '
                f"got {json.dumps(call)}",
                "tool_calls",
            )
        normalized.append({"name": call["name"], "arguments": call.get("arguments", {})})
    if not answers and not normalized:
        raise bad('nothing to check: give "answer" and/or "tool_calls"')
    difficulty = data.get("difficulty", 1)
    if isinstance(difficulty, bool) or not isinstance(difficulty, int) or not 1 <= difficulty <= 10:
        raise bad(f"must be an integer from 1 to 10, got {json.dumps(difficulty)}", "difficulty")
    return CheckedScenario(
        task=task,
        difficulty=difficulty,
        expected=", ".join(str(a) for a in answers) or None,
        answer=answers,
        tool_calls=normalized,
    )


def required_tools(scenarios: Sequence[art.Scenario]) -> set[str]:
    """The tool names the scenarios' checks require calls to (OpenAI names)."""
    return {
        call["name"]
        for scenario in scenarios
        if isinstance(scenario, CheckedScenario)
        for call in scenario.tool_calls
    }


def check_offered_tools(
    scenarios: Sequence[art.Scenario], offered: Sequence[McpTool], *, all_of_server: bool = False
) -> None:
    """Raise `McpScenarioToolsError` when a scenario requires a call to a tool the agent is not
    offered (`offered` and `complete_task`): that check could never pass. `all_of_server`: the
    offered tools are all the server has (no `allowed_tools`), so more cannot be offered."""
    names = {tool.openai_name for tool in offered} | {"complete_task"}
    missing: dict[str, list[int]] = {}
    for number, scenario in enumerate(scenarios, 1):
        if isinstance(scenario, CheckedScenario):
            for call in scenario.tool_calls:
                if call["name"] not in names and number not in missing.get(call["name"], []):
                    missing.setdefault(call["name"], []).append(number)
    if not missing:
        return
    affected = {number for numbers in missing.values() for number in numbers}
    callers = "; ".join(_callers(name, numbers, scenarios) for name, numbers in missing.items())
    seen_as = {tool.name: tool.openai_name for tool in offered if tool.name != tool.openai_name}
    renamed = [
        f"{name!r} is offered to the model as {seen_as[name]!r}"
        for name in missing
        if name in seen_as
    ]
    absent = [name for name in missing if name not in seen_as]
    if not absent:
        todo = ""
    elif all_of_server:
        todo = (
            f" The server has no tool named {', '.join(map(repr, absent))}: correct the names, or "
            "remove those calls from the scenarios."
        )
    else:
        wanted = ",".join([*(tool.name for tool in offered), *absent])
        todo = (
            f" Offer them too (`art mcp-train --tools {wanted}`, or McpServer(..., "
            "allowed_tools=[...]) with them), or remove those calls from the scenarios."
        )
    raise McpScenarioToolsError(
        f"{len(affected)} scenario(s) require calls to tools the agent is not offered, so those "
        f"checks could never pass: {callers}. Offered: "
        f"{', '.join(tool.openai_name for tool in offered) or 'none'} (and complete_task)."
        + "".join(f" {hint}: write that name in the scenarios." for hint in renamed)
        + todo,
        missing=missing,
    )


def _callers(
    name: str, numbers: list[int], scenarios: Sequence[art.Scenario], shown: int = 3
) -> str:
    listed = ", ".join(f"{n} ({scenarios[n - 1].task[:50]!r})" for n in numbers[:shown])
    more = f" and {len(numbers) - shown} more" if len(numbers) > shown else ""
    return f"{name!r} by scenario {listed}{more}"


def final_answer(trajectory: art.Trajectory) -> str:
    """The run's answer: its `complete_task` summary, else its last assistant message."""
    if trajectory.metadata.get("summary") is not None:
        return str(trajectory.metadata["summary"])
    for message in reversed(trajectory.messages()):
        if message.get("role") == "assistant" and message.get("content"):
            return str(message["content"])
    return ""


def made_calls(trajectory: art.Trajectory) -> list[tuple[str, dict[str, Any]]]:
    """(tool name, arguments) of every tool call the run made, in order (bad JSON: {})."""
    calls = []
    for message in trajectory.messages():
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            try:
                arguments = json.loads(function.get("arguments") or "{}")
            except json.JSONDecodeError:
                arguments = {}
            calls.append(
                (function.get("name", ""), arguments if isinstance(arguments, dict) else {})
            )
    return calls


def score(scenario: CheckedScenario, trajectory: art.Trajectory) -> dict[str, float]:
    """{"reward": share of checks passed, "answer_correct", "tools_correct"} for one run."""
    answer = final_answer(trajectory)
    answer_hits = [_answer_contains(answer, item) for item in scenario.answer]
    calls = made_calls(trajectory)
    call_hits = [
        any(
            name == want["name"] and _arguments_match(args, want["arguments"])
            for name, args in calls
        )
        for want in scenario.tool_calls
    ]
    hits = answer_hits + call_hits
    return {
        "reward": sum(hits) / len(hits) if hits else 0.0,
        "answer_correct": float(all(answer_hits)) if answer_hits else 1.0,
        "tools_correct": float(all(call_hits)) if call_hits else 1.0,
    }


async def code_reward(
    scenario: art.Scenario, trajectory: art.Trajectory, check: Check | None
) -> float:
    """The run's code reward: `check`'s, else the scenario's checks (`score`); sets the
    trajectory's reward and metrics and returns the reward."""
    if check is not None:
        value = check(scenario, trajectory)
        if inspect.isawaitable(value):
            value = await value
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise McpConfigError(
                f"check() returned {value!r} for the task {scenario.task[:60]!r}: it must return "
                "a number from 0 to 1"
            )
        reward = float(value)
    elif isinstance(scenario, CheckedScenario) and scenario.checkable:
        scores = score(scenario, trajectory)
        reward = scores.pop("reward")
        trajectory.metrics.update(scores)
    else:
        raise McpConfigError(
            f"The task {scenario.task[:60]!r} has nothing to check: give scenarios from a "
            "scenario file (answer / tool_calls), a check function, or use reward='ruler'."
        )
    trajectory.reward = reward
    return reward


def _answer_contains(answer: str, item: str | float) -> bool:
    if isinstance(item, str):
        return " ".join(item.lower().split()) in " ".join(answer.lower().split())
    for token in _NUMBER.findall(answer):
        try:
            if math.isclose(float(token.replace(",", "")), float(item), abs_tol=1e-9):
                return True
        except ValueError:
            continue
    return False


def _arguments_match(made: dict[str, Any], wanted: dict[str, Any]) -> bool:
    for key, value in wanted.items():
        if key not in made:
            return False
        got = made[key]
        if isinstance(value, str) and isinstance(got, str):
            if got.strip().lower() != value.strip().lower():
                return False
        elif isinstance(value, int | float) and isinstance(got, int | float | str):
            try:
                if not math.isclose(float(got), float(value)):
                    return False
            except ValueError:
                return False
        elif got != value:
            return False
    return True
