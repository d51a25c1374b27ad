"""Generated scenarios: training inputs from a task description, when there is no data set.

    scenarios = await art.generate_scenarios("Answer questions about ...", 40, generator=model)
    train, val = art.split_scenarios(scenarios, val_fraction=0.2)
    art.save_scenarios("scenarios.jsonl", scenarios)

The generator answers under a JSON schema; each scenario is validated (a real task, difficulty in
range), duplicates (same normalized text) are dropped, and the generator is asked again for what is
still missing, shown what it already wrote, until `n` are valid or the attempts run out.

Fitting the context. A batch of k scenarios asks for k * 250 + 50 completion tokens. When the
generator answers that prompt plus answer exceed its context window, the sizes in its answer
(context and prompt tokens, as OpenAI, vLLM and our backend word them) say what room is left:
the batch is asked again with as many scenarios as fit (fewer of the already-written tasks shown
if even one does not), and later batches are sized to fit from the start. When not one
scenario fits, `GeneratorContextError` says so with the numbers.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from art_core.errors import (
    GeneratorContextError,
    GeneratorError,
    JudgeContextError,
    JudgeError,
    JudgeResponseError,
    ScenarioGenerationError,
)
from art_core.model import Model
from art_core.rewards._cache import ResponseCache, resolve_cache
from art_core.rewards._judge_models import resolve_model
from art_core.rewards._judge_usage import JudgeUsage
from art_core.rewards._structured_completion import structured_completion
from art_core.utils._jsonl import jsonl_lines

MIN_TASK_CHARS = 12
MAX_TASK_CHARS = 400
MAX_EXPECTED_CHARS = 200
# Completion tokens asked per scenario (a task of up to 400 characters, an expected answer of up
# to 200, the JSON around them) and for the list around them: generous for common tokenizers.
TOKENS_PER_SCENARIO = 250
ANSWER_OVERHEAD_TOKENS = 50
SHOWN_EXISTING = 30  # already-written tasks shown to the generator, so it writes different ones

# The sizes in a context-overflow answer. Context: "maximum context length is 2048" (OpenAI,
# vLLM, ours), "context of 2048" (ours). Prompt: "The prompt has 1500 tokens" (ours), "(1500 in
# the messages, ...)" (OpenAI, vLLM), "your request has 1500 input tokens" (vLLM),
# "your messages resulted in 1500 tokens" (OpenAI).
_CONTEXT_TOKENS = re.compile(r"context (?:length |window )?(?:is|of) (\d+)", re.IGNORECASE)
_PROMPT_TOKENS = re.compile(
    r"prompt has (\d+)|(\d+) in the messages|request has (\d+) input|messages resulted in (\d+)",
    re.IGNORECASE,
)


class Scenario(BaseModel):
    """One input for a rollout: the task as the agent receives it, its difficulty, and
    optionally what a correct outcome looks like (for a judge or a check)."""

    task: str = Field(min_length=1)
    difficulty: int = Field(ge=1, le=10)
    expected: str | None = None

    @property
    def id(self) -> str:
        """Stable across runs and machines: a hash of the normalized task."""
        return hashlib.sha256(normalize_task(self.task).encode()).hexdigest()[:16]


def normalize_task(text: str) -> str:
    """Case, accents, punctuation and spacing removed: what makes two tasks the same."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().lower()
    return " ".join(re.sub(r"[^a-z0-9]+", " ", text).split())


GENERATOR_PROMPT = """\
You write realistic tasks for training an AI agent. The agent's job:

{description}
{tools}
Write {count} new tasks, each one a message a real user would send to this agent. Make them \
varied in topic, wording and length; each must make sense on its own and be answerable by the \
agent. Give each a difficulty from {low} (easy) to {high} (hard), spread across that range. \
Where a correct answer is short and certain, put it in "expected"; otherwise set it to null.{custom}"""


async def generate_scenarios(
    description: str,
    n: int,
    generator: Model | str,
    tools: list[dict[str, Any]] | None = None,
    difficulty: tuple[int, int] = (1, 5),
    custom_instructions: str | None = None,
    *,
    batch_size: int = 4,
    concurrency: int = 4,
    max_requests: int | None = None,
    cache: bool | str | Path | ResponseCache | None = True,
    sampling: dict[str, Any] | None = None,
    timeout: float = 600.0,
    usage: JudgeUsage | None = None,
) -> list[Scenario]:
    """`n` valid, distinct scenarios for `description`, asked of `generator` in batches.

    `tools` (OpenAI function specs) are shown so tasks use them. With `cache` (the default), a
    re-run with the same arguments returns the same scenarios without requests; pass
    `cache=False` for fresh ones. Batches of `batch_size` are asked `concurrency` at a time, each
    leaning to one difficulty level for variety; batches shrink to fit the generator's context
    (see the module doc). Raises `ScenarioGenerationError` when `max_requests` (default: enough
    for three tries per batch) do not give `n`, its subclass `GeneratorContextError` when not one
    scenario fits the generator's context, and `GeneratorError` when the generator fails.
    """
    low, high = difficulty
    if not 1 <= low <= high <= 10:
        raise ValueError(
            f"difficulty must be (low, high) with 1 <= low <= high <= 10, got {difficulty}"
        )
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not description.strip():
        raise ValueError("description is empty: describe the agent's job in a sentence or more")
    run = _Generation(
        model=resolve_model(generator),
        description=description,
        tools=tools,
        low=low,
        high=high,
        custom_instructions=custom_instructions,
        cache=cache,
        sampling=sampling,
        timeout=timeout,
        usage=usage if usage is not None else JudgeUsage(),
        fitted_batch_size=batch_size,
    )
    return await run.until(n, concurrency, max_requests)


@dataclass
class _Generation:
    """One `generate_scenarios` call: the scenarios so far, what was rejected, what fits the
    generator's context (learnt from its refusals), and the requests made."""

    model: Model
    description: str
    tools: list[dict[str, Any]] | None
    low: int
    high: int
    custom_instructions: str | None
    cache: bool | str | Path | ResponseCache | None
    sampling: dict[str, Any] | None
    timeout: float
    usage: JudgeUsage
    fitted_batch_size: int  # lowered when the generator's context holds fewer
    scenarios: list[Scenario] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    rejected: dict[str, int] = field(
        default_factory=lambda: {"duplicate": 0, "invalid": 0, "unusable answer": 0}
    )
    examples_of_invalid: list[str] = field(default_factory=list)
    requests_made: int = 0
    room: _ContextRoom = field(default_factory=lambda: _ContextRoom())

    async def until(self, n: int, concurrency: int, max_requests: int | None) -> list[Scenario]:
        """Ask in rounds of up to `concurrency` batches until `n` scenarios or the limit."""
        levels = self.high - self.low + 1
        while len(self.scenarios) < n:
            # Default: enough requests for three tries per batch (of the size that fits).
            limit = max_requests or 3 * math.ceil(n / self.fitted_batch_size) + 2
            if self.requests_made >= limit:
                break
            # Up to `concurrency` batches at once (a local backend answers them in one batch).
            missing = n - len(self.scenarios)
            batches = min(
                concurrency, math.ceil(missing / self.fitted_batch_size), limit - self.requests_made
            )
            asked = min(missing, batches * self.fitted_batch_size)  # never more than a batch each
            counts = [asked // batches + (k < asked % batches) for k in range(batches)]
            answers = await asyncio.gather(
                *(
                    self.one_batch(count, self.low + (self.requests_made + k) % levels)
                    for k, count in enumerate(counts)
                ),
                return_exceptions=True,  # let every batch finish before a failure ends the call
            )
            self.requests_made += batches
            for answer in answers:
                if isinstance(answer, BaseException):
                    raise answer
            for item in (item for batch in answers if batch for item in batch):  # type: ignore[union-attr]
                if self.accept(item) and len(self.scenarios) == n:
                    return self.scenarios
        details = ", ".join(f"{count} {reason}" for reason, count in self.rejected.items() if count)
        invalid = self.examples_of_invalid
        raise ScenarioGenerationError(
            f"Got {len(self.scenarios)} of {n} scenarios from {self.model.get_inference_name()} "
            f"in {self.requests_made} requests (rejected: {details or 'none'}). "
            + (f"Invalid ones: {'; '.join(invalid)}. " if invalid else "")
            + "Use a stronger generator, a more specific description, or raise max_requests."
        )

    def accept(self, item: Any) -> bool:
        """Keep one generated item if it is a valid scenario not seen before."""
        try:
            scenario = Scenario.model_validate(item)
            problem = _problem(scenario, self.low, self.high)
        except ValidationError as error:
            scenario, problem = None, error.errors()[0]["msg"]
        if problem or scenario is None:
            self.rejected["invalid"] += 1
            if len(self.examples_of_invalid) < 3:
                self.examples_of_invalid.append(f"{str(item)[:80]!r}: {problem}")
            return False
        key = normalize_task(scenario.task)
        if key in self.seen:
            self.rejected["duplicate"] += 1
            return False
        self.seen.add(key)
        self.scenarios.append(scenario)
        return True

    def prompt_for(self, count: int, focus: int, shown: int) -> str:
        existing = self.scenarios[-shown:] if shown else []
        prompt = _prompt(
            self.description, count, self.tools, self.low, self.high,
            self.custom_instructions, existing,
        )  # fmt: skip
        if self.high > self.low and count < self.high - self.low + 1:
            prompt += f"\n\nThis time, make most of them difficulty {focus}."
        return prompt

    async def one_batch(self, count: int, focus: int) -> list[Any] | None:
        """One request for `count` scenarios leaning to difficulty `focus`, made to fit the
        generator's context; None when its answer could not be used."""
        shown = SHOWN_EXISTING
        for _ in range(8):  # each pass learns the room or shows fewer tasks: a few suffice
            prompt = self.prompt_for(count, focus, shown)
            room_for = self.room.scenarios_after(prompt)
            if room_for is not None and room_for < 1:
                if shown and self.scenarios:
                    shown //= 2  # a shorter prompt: fewer of the written tasks shown
                    continue
                raise _context_error(self.model, self.room, prompt, self.tools)
            fitted = count if room_for is None else min(count, room_for)
            self.fitted_batch_size = min(self.fitted_batch_size, fitted)
            prompt = self.prompt_for(fitted, focus, shown)
            call_usage = JudgeUsage()
            try:
                return await self.ask(prompt, fitted, call_usage)
            except JudgeResponseError:
                self.rejected["unusable answer"] += 1
                return None
            except JudgeContextError as error:
                if call_usage.reasks:
                    # The first answer fitted; the re-ask (it plus a correction) did not.
                    self.rejected["unusable answer"] += 1
                    return None
                self.learn_room(error, prompt)
            except JudgeError as error:
                raise GeneratorError(
                    f"The scenario generator failed: {error}. Check the generator model "
                    "(its URL, key and name), or pass another one (generator=..., "
                    "--generator on the command line)."
                ) from error
            finally:
                self.usage.add(call_usage)
        raise _context_error(self.model, self.room, prompt, self.tools)

    async def ask(self, prompt: str, count: int, usage: JudgeUsage) -> list[Any]:
        return await structured_completion(
            self.model,
            [{"role": "user", "content": prompt}],
            schema_name="scenarios",
            schema=scenario_schema(count, self.low, self.high),
            validate=_as_list,
            correction=lambda problems: (
                f"Your answer cannot be used: {'; '.join(problems)}. "
                'Answer again with only the JSON object {"scenarios": [...]}.'
            ),
            usage=usage,
            cache=resolve_cache(self.cache),
            max_tokens=count * TOKENS_PER_SCENARIO + ANSWER_OVERHEAD_TOKENS,
            sampling=self.sampling,
            timeout=self.timeout,
        )

    def learn_room(self, error: JudgeContextError, prompt: str) -> None:
        """What the generator's refusal says of its context, for the next prompt's size."""
        sizes = context_sizes(str(error))
        if sizes is None:
            raise GeneratorContextError(
                f"The scenario generator {self.model.get_inference_name()} refused the prompt "
                f"as too long for its context, without saying the sizes: {error}. Use a "
                "generator with a longer context, a shorter description, or fewer tools."
            ) from error
        self.room.learn(*sizes, len(prompt))


def context_sizes(message: str) -> tuple[int, int] | None:
    """(context tokens, prompt tokens) from a context-overflow error message, if it says both."""
    context = _CONTEXT_TOKENS.search(message)
    prompt = _PROMPT_TOKENS.search(message)
    if context is None or prompt is None:
        return None
    return int(context.group(1)), int(next(group for group in prompt.groups() if group))


@dataclass
class _ContextRoom:
    """What the generator told of its context window, to size the next prompts' answers."""

    context: int | None = None
    tokens_per_char: float = 0.0  # of our prompt, chat template included: an overestimate
    measured: tuple[int, int] = (0, 0)  # (characters, tokens) of the last prompt refused

    def learn(self, context: int, prompt_tokens: int, prompt_chars: int) -> None:
        self.context = context
        self.tokens_per_char = max(self.tokens_per_char, prompt_tokens / max(prompt_chars, 1))
        self.measured = (prompt_chars, prompt_tokens)

    def prompt_tokens(self, prompt: str) -> int:
        """The generator's count for the prompt it refused; for others an estimate from the
        learned ratio, with a margin (tokenizers differ by text)."""
        if len(prompt) == self.measured[0]:
            return self.measured[1]
        return math.ceil(len(prompt) * self.tokens_per_char * 1.05) + 8

    def scenarios_after(self, prompt: str) -> int | None:
        """How many scenarios' answers fit after `prompt`; None while the context is unknown."""
        if self.context is None:
            return None
        left = self.context - self.prompt_tokens(prompt) - ANSWER_OVERHEAD_TOKENS
        return left // TOKENS_PER_SCENARIO


def _context_error(
    model: Model, room: _ContextRoom, prompt: str, tools: list[dict[str, Any]] | None
) -> GeneratorContextError:
    counted = "" if len(prompt) == room.measured[0] else "about "
    tools_part = ""
    if tools:
        tools_part = f" and the {len(tools)} tool" + ("s" if len(tools) > 1 else "")
    return GeneratorContextError(
        f"The scenario generator {model.get_inference_name()} has a context of {room.context} "
        f"tokens; the prompt (the description{tools_part}) takes {counted}"
        f"{room.prompt_tokens(prompt)}, and one scenario needs "
        f"{TOKENS_PER_SCENARIO + ANSWER_OVERHEAD_TOKENS} more. Use a generator with a longer "
        "context (generator=..., --generator on the command line), a shorter description"
        + (", or fewer tools (allowed_tools, --tools)." if tools else ".")
    )


def scenario_schema(count: int, low: int, high: int) -> dict[str, Any]:
    """Exactly `count` scenarios; each a task, an integer difficulty in range, expected or null."""
    item = {
        "type": "object",
        "properties": {
            "task": {"type": "string", "minLength": MIN_TASK_CHARS, "maxLength": MAX_TASK_CHARS},
            "difficulty": {"type": "integer", "minimum": low, "maximum": high},
            "expected": {
                "anyOf": [{"type": "string", "maxLength": MAX_EXPECTED_CHARS}, {"type": "null"}]
            },
        },
        "required": ["task", "difficulty", "expected"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {
            "scenarios": {"type": "array", "items": item, "minItems": count, "maxItems": count}
        },
        "required": ["scenarios"],
        "additionalProperties": False,
    }


def _prompt(
    description: str,
    count: int,
    tools: list[dict[str, Any]] | None,
    low: int,
    high: int,
    custom_instructions: str | None,
    existing: list[Scenario],
) -> str:
    tool_lines = ""
    if tools:
        lines = []
        for tool in tools:
            function = tool.get("function", tool)
            lines.append(
                f"- {function.get('name')}: {function.get('description') or ''}".rstrip(": ")
            )
        tool_lines = (
            "\nThe agent can use these tools; write tasks that need them:\n"
            + "\n".join(lines)
            + "\n"
        )
    custom = f"\n\n{custom_instructions.strip()}" if custom_instructions else ""
    prompt = GENERATOR_PROMPT.format(
        description=description.strip(),
        tools=tool_lines,
        count=count,
        low=low,
        high=high,
        custom=custom,
    )
    if existing:
        shown = "\n".join(f"- {s.task[:120]}" for s in existing)
        prompt += f"\n\nThese tasks already exist; write different ones:\n{shown}"
    return prompt


def _as_list(parsed: Any) -> tuple[list[Any] | None, list[str]]:
    if not isinstance(parsed, dict) or not isinstance(parsed.get("scenarios"), list):
        return None, ['the answer must be a JSON object {"scenarios": [...]}']
    return parsed["scenarios"], []


def _problem(scenario: Scenario, low: int, high: int) -> str | None:
    task = scenario.task.strip()
    if len(task) < MIN_TASK_CHARS or len(normalize_task(task).split()) < 3:
        return "the task is too short to be a real request"
    if len(task) > MAX_TASK_CHARS:
        return f"the task is longer than {MAX_TASK_CHARS} characters"
    if not low <= scenario.difficulty <= high:
        return f"difficulty {scenario.difficulty} is outside {low}..{high}"
    return None


def save_scenarios(path: str | Path, scenarios: list[Scenario]) -> None:
    """One JSON object per line."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with Path(path).open("w") as out:
        for scenario in scenarios:
            out.write(json.dumps(scenario.model_dump(), ensure_ascii=False) + "\n")


def load_scenarios(path: str | Path) -> list[Scenario]:
    """Scenarios saved by `save_scenarios` (a bad line names its number)."""
    scenarios = []
    for number, _, data in jsonl_lines(path, lambda message, _: ValueError(message)):
        try:
            scenarios.append(Scenario.model_validate(data))
        except ValidationError as error:
            raise ValueError(
                f"{path}, line {number}: not a scenario: {error.errors()[0]['msg']}"
            ) from error
    return scenarios


def split_scenarios(
    scenarios: list[Scenario], val_fraction: float = 0.2, *, seed: int = 0
) -> tuple[list[Scenario], list[Scenario]]:
    """(train, val), deterministic: the same scenarios and `seed` give the same split in any order
    (ranked by a hash of each task), and val holds round(len * val_fraction) of them."""
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    ranked = sorted(scenarios, key=lambda s: hashlib.sha256(f"{seed}:{s.id}".encode()).hexdigest())
    val_ids = {s.id for s in ranked[: round(len(scenarios) * val_fraction)]}
    return [s for s in scenarios if s.id not in val_ids], [s for s in scenarios if s.id in val_ids]
