"""RULER: an LLM judge scores the runs of one group relative to each other, as the reward.

    group = await art.ruler_score_group(group, "openai/o3", debug=True)       # ART's call
    group = await art.ruler_score_group(group, judge="openai/gpt-4.1-mini")   # ours
    groups = await art.gather_trajectory_groups(..., after_each=functools.partial(
        art.ruler_score_group, judge=judge, swallow_exceptions=True))

GRPO only needs rewards that rank the runs of a group, so a judge that sees them side by side is
enough; no reward code. Each scored trajectory names the judge call it got its reward from:
`metadata["judge_cache_key"]`, the cache key of that request (two with `reverse_order_check`),
which the server records in the step's replay manifest. The prompt layout is in
`_ruler_prompt.py`; the call, its one re-ask, retries, cost and cache in
`_structured_completion.py`; ART's `extra_litellm_params` in `_litellm_params.py`.

Both take ART 0.5.23's positional order, `(message_lists, judge_model, extra_litellm_params,
rubric, tools)` and `(group, judge_model, extra_litellm_params, rubric)`, and ours,
`(message_lists, judge, rubric, tools)` and `(group, judge, rubric)`: the third argument tells
them apart, a dict (or None) being ART's `extra_litellm_params` and a str our rubric.
`judge_model=` and `judge=` are one argument; without either the judge is ART's default,
`"openai/o3"`.
"""

from __future__ import annotations

import inspect
import logging
import math
import pprint
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from art_core._unknown_fields import StrictModel, check_names
from art_core.errors import JudgeContextError, JudgeError, UnsupportedOptionError
from art_core.model import Model
from art_core.rewards._cache import ResponseCache, resolve_cache
from art_core.rewards._judge_usage import JudgeUsage
from art_core.rewards._litellm_params import JudgeCall, judge_call
from art_core.rewards._ruler_prompt import (
    DEFAULT_MESSAGE_CHAR_BUDGET,
    DEFAULT_RUBRIC,
    MIN_MESSAGE_CHAR_BUDGET,
    SCORE_SCALE,
    JudgePrompt,
    build_judge_prompt,
    distinct_runs,
)
from art_core.rewards._structured_completion import structured_completion
from art_core.trajectories import Trajectory, TrajectoryGroup

__all__ = ["DEFAULT_RUBRIC", "RulerScore", "ruler", "ruler_score_group"]

logger = logging.getLogger("art_core.ruler")

# ART's judge when none is named (it needs OPENAI_API_KEY).
DEFAULT_JUDGE = "openai/o3"

Tools = list[dict[str, Any]]


class RulerScore(StrictModel):
    """One run's score in [0, 1] and the judge's explanation (ART's `TrajectoryScore`).

    `trajectory_id`: "1", "2", ... in the order the runs were given, as ART numbers them.
    `position_gap`: with `reverse_order_check`, how much the score moved when the runs were
    shown in reverse order (0 when the judge is free of position bias).
    """

    trajectory_id: str = ""
    score: float
    explanation: str
    position_gap: float | None = None


async def ruler(
    message_lists: list[list[dict[str, Any]]],
    judge_model: Model | str | None = None,
    extra_litellm_params: Mapping[str, Any] | str | None = None,
    rubric: str | Tools | None = None,
    tools: Tools | None = None,
    *,
    judge: Model | str | None = None,
    debug: bool = False,
    message_char_budget: int = DEFAULT_MESSAGE_CHAR_BUDGET,
    reverse_order_check: bool = False,
    cache: bool | str | Path | ResponseCache | None = True,
    max_tokens: int | None = None,
    sampling: dict[str, Any] | None = None,
    timeout: float | None = None,
    max_retries: int | None = None,
    usage: JudgeUsage | None = None,
) -> list[RulerScore]:
    """Score each conversation (same task, one per run) relative to the others; one per list.

    `judge_model` (or `judge=`): an `art.Model` or `"<provider>/<model>"`, `"openai/o3"` when
    neither is given. `extra_litellm_params`: ART's LiteLLM settings (`api_base`, `api_key`,
    `temperature`, `max_tokens`, ...; see `_litellm_params.py`). The third positional argument
    may instead be our rubric (a str), then the fourth the tools. `debug`: print the judge's
    scores and explanations, as ART does. `reverse_order_check`: judge again with the runs in
    reverse order and average (twice the cost; removes position bias). `cache`: a folder, True
    for `~/.cache/art-trainer/judge`, False for none. `usage` accumulates cost.
    `message_char_budget`: each message is cut to this many characters (marked); if the judge
    still answers that the prompt exceeds its context, the budget is halved and the prompt
    resent, down to 200 characters. `sampling` (e.g. `{"temperature": 0.3}`) defaults to
    greedy (temperature 0). `timeout` (600 s) and `max_retries` (3) bound each request.
    """
    chosen, extra, rubric_text, tools = _art_or_our_order(
        "ruler()", judge_model, judge, extra_litellm_params, rubric, tools
    )
    scores, _ = await _ruler_with_keys(
        message_lists,
        chosen,
        extra,
        rubric_text,
        tools,
        debug=debug,
        message_char_budget=message_char_budget,
        reverse_order_check=reverse_order_check,
        cache=cache,
        max_tokens=max_tokens,
        sampling=sampling,
        timeout=timeout,
        max_retries=max_retries,
        usage=usage,
    )
    return scores


def _art_or_our_order(
    owner: str,
    judge_model: Model | str | None,
    judge: Model | str | None,
    extra_litellm_params: Mapping[str, Any] | str | None,
    rubric: str | Tools | None,
    tools: Tools | None,
) -> tuple[Model | str, Mapping[str, Any] | None, str, Tools | None]:
    """The judge, LiteLLM's settings, the rubric and the tools of a call in either order."""
    if judge_model is not None and judge is not None:
        raise UnsupportedOptionError(
            f"{owner}: judge_model and judge are one argument (ART's name and ours): pass one."
        )
    chosen = judge_model if judge_model is not None else judge
    if isinstance(extra_litellm_params, str):  # our order: (judge, rubric, tools)
        if isinstance(rubric, str) or (rubric is not None and tools is not None):
            raise UnsupportedOptionError(
                f"{owner}: the third argument {extra_litellm_params[:40]!r} is the rubric (our "
                "order: judge, rubric, tools), so rubric or tools is given twice: pass each once."
            )
        extra_litellm_params, rubric, tools = None, extra_litellm_params, rubric or tools
    if rubric is not None and not isinstance(rubric, str):
        raise UnsupportedOptionError(
            f"{owner}: rubric is a str, got a {type(rubric).__name__}; in ART's order the tools "
            "come after it: (judge_model, extra_litellm_params, rubric, tools), or pass tools=."
        )
    if extra_litellm_params is not None and not isinstance(extra_litellm_params, Mapping):
        raise UnsupportedOptionError(
            f"{owner}: extra_litellm_params is a dict of LiteLLM's settings (or, third, our "
            f"rubric as a str), got a {type(extra_litellm_params).__name__}."
        )
    return (
        chosen if chosen is not None else DEFAULT_JUDGE,
        extra_litellm_params,
        rubric if rubric is not None else DEFAULT_RUBRIC,
        tools,
    )


async def _ruler_with_keys(
    message_lists: list[list[dict[str, Any]]],
    judge: Model | str,
    extra_litellm_params: Mapping[str, Any] | None,
    rubric: str,
    tools: Tools | None,
    *,
    debug: bool,
    message_char_budget: int,
    reverse_order_check: bool,
    cache: bool | str | Path | ResponseCache | None,
    max_tokens: int | None,
    sampling: dict[str, Any] | None,
    timeout: float | None,
    max_retries: int | None,
    usage: JudgeUsage | None,
) -> tuple[list[RulerScore], list[str]]:
    """`ruler`, and the cache keys of the judge calls whose answers gave the scores."""
    if message_char_budget < MIN_MESSAGE_CHAR_BUDGET:
        raise ValueError(
            f"message_char_budget must be >= {MIN_MESSAGE_CHAR_BUDGET} characters, "
            f"got {message_char_budget}"
        )
    if not message_lists:
        return [], []
    call = judge_call(
        judge,
        extra_litellm_params,
        sampling=sampling,
        max_tokens=max_tokens,
        timeout=timeout,
        max_retries=max_retries,
    )
    usage = usage if usage is not None else JudgeUsage()
    distinct = distinct_runs(message_lists, tools)
    response_cache = resolve_cache(cache)
    budget = message_char_budget
    keys: list[str] = []

    async def judge_in(order: list[int] | None) -> list[RulerScore]:
        """Judge the runs in `order`; a prompt too long for the judge is cut harder and resent."""
        nonlocal budget
        while True:
            prompt = build_judge_prompt(
                distinct, rubric=rubric, order=order, message_char_budget=budget
            )
            try:
                scores = await _judge(prompt, call, response_cache, usage, keys)
            except JudgeContextError:
                if budget <= MIN_MESSAGE_CHAR_BUDGET:
                    raise
                budget = max(MIN_MESSAGE_CHAR_BUDGET, budget // 2)
                logger.warning(
                    "The RULER prompt is too long for %s: cutting messages to %d characters",
                    call.model.get_inference_name(),
                    budget,
                )
                continue
            usage.truncated_messages += prompt.truncated_messages
            usage.truncated_chars += prompt.truncated_chars
            return scores

    scores = await judge_in(None)
    if reverse_order_check and len(distinct.runs) > 1:
        order = list(reversed(range(len(distinct.runs))))
        reversed_scores = await judge_in(order)
        for position, index in enumerate(order):
            first, second = scores[index], reversed_scores[position]
            scores[index] = RulerScore(
                score=(first.score + second.score) / 2,
                explanation=first.explanation,
                position_gap=abs(first.score - second.score),
            )
    numbered = [
        scores[index].model_copy(update={"trajectory_id": str(number)})
        for number, index in enumerate(distinct.index_of, start=1)
    ]
    if debug:
        print_judgement(numbered)
    return numbered, keys


def print_judgement(scores: list[RulerScore]) -> None:
    """What ART prints with `debug=True`: each trajectory's id, the judge's explanation, score."""
    print("\n[RULER] Pretty-printed LLM choice JSON:")
    shown = [
        {"trajectory_id": s.trajectory_id, "explanation": s.explanation, "score": s.score}
        for s in scores
    ]
    pprint.pprint({"scores": shown}, sort_dicts=False)


async def _judge(
    prompt: JudgePrompt,
    call: JudgeCall,
    cache: ResponseCache | None,
    usage: JudgeUsage,
    keys: list[str],
) -> list[RulerScore]:
    count = prompt.num_runs
    return await structured_completion(
        call.model,
        prompt.messages,
        schema_name="ruler_scores",
        schema=prompt.schema,
        validate=lambda parsed: validate_scores(parsed, count),
        correction=lambda problems: correction_message(problems, count),
        usage=usage,
        cache=cache,
        max_tokens=call.max_tokens,
        sampling=call.sampling,
        timeout=call.timeout,
        max_retries=call.max_retries,
        keys=keys,
    )


# The keywords `ruler_score_group` passes through to `ruler` (the rest it fills in itself),
# with `ruler`'s defaults; the judge goes apart.
RULER_DEFAULTS = {
    name: parameter.default
    for name, parameter in inspect.signature(ruler).parameters.items()
    if parameter.kind is inspect.Parameter.KEYWORD_ONLY and name != "judge"
}
RULER_OPTIONS = list(RULER_DEFAULTS)


def validate_scores(parsed: Any, count: int) -> tuple[list[RulerScore] | None, list[str]]:
    """Exactly run_1..run_count, each with a score from 0 to 100 (returned / 100); every
    problem named. A judge that ignores the schema may write a decimal: accepted in range."""
    expected = [f"run_{k}" for k in range(1, count + 1)]
    if not isinstance(parsed, dict):
        return None, [f"it is a JSON {type(parsed).__name__}, not an object with keys run_1..."]
    problems = [
        f'"{key}" is not one of the runs (the ids are 1 to {count})'
        for key in parsed
        if key not in expected
    ]
    scores = []
    for key in expected:
        item = parsed.get(key)
        if item is None:
            problems.append(f'"{key}" is missing')
            continue
        score, explanation = (
            (item.get("score"), item.get("explanation", ""))
            if isinstance(item, dict)
            else (item, "")
        )
        if isinstance(score, bool) or not isinstance(score, int | float):
            problems.append(f'"{key}" has no numeric "score" (got {score!r:.40})')
        elif not math.isfinite(score) or not 0 <= score <= SCORE_SCALE:
            problems.append(f'"{key}" has score {score}, outside 0 to {SCORE_SCALE}')
        else:
            scores.append(
                RulerScore(score=float(score) / SCORE_SCALE, explanation=str(explanation or ""))
            )
    return (scores if not problems else None), problems


def correction_message(problems: list[str], count: int) -> str:
    last = f"run_{count}"
    return (
        f"Your answer cannot be used: {'; '.join(problems)}. Answer again with only the JSON "
        f"object: exactly the keys run_1 to {last}, one per run, each "
        '{"explanation": "<one or two sentences>", "score": <an integer from 0 to 100>}.'
    )


def judged_messages(trajectory: Trajectory) -> list[dict[str, Any]]:
    """What the judge sees of a trajectory: its main conversation, then any additional ones."""
    messages = list(trajectory.messages())
    for number, history in enumerate(trajectory.additional_histories, start=2):
        messages.append({"role": "system", "content": f"(conversation {number} of this run)"})
        messages += history.messages()
    return messages


async def ruler_score_group(
    group: TrajectoryGroup,
    judge_model: Model | str | None = None,
    extra_litellm_params: Mapping[str, Any] | str | None = None,
    rubric: str | None = None,
    *,
    judge: Model | str | None = None,
    swallow_exceptions: bool = False,
    debug: bool = False,
    **options: Any,
) -> TrajectoryGroup | None:
    """A new group whose rewards are the judge's scores (see `ruler` for the judge, ART's
    `extra_litellm_params`, `debug` and `options`; the third argument may be our rubric).

    Each trajectory keeps its previous reward in `metrics["independent_reward"]`, gets
    `metrics["ruler_score"]`, the explanation in its logs and the judge call's cache key in
    `metadata["judge_cache_key"]` (a list of two with `reverse_order_check`); the judge's usage is added to the
    group's metrics (summed into the step's), and to `options["usage"]` when given. A judge
    failure raises a `JudgeError`, or with `swallow_exceptions=True` is logged and returns None:
    as `after_each`, the group is dropped and counted in the step's
    `groups/dropped_before_training`.
    """
    # Checked before anything else: a misspelt option is an error even for an empty group, and
    # it is never mistaken for a judge failure that `swallow_exceptions` would drop.
    check_names("ruler_score_group()", options, [*RULER_OPTIONS, "rubric", "swallow_exceptions"])
    chosen, extra, rubric_text, _ = _art_or_our_order(
        "ruler_score_group()", judge_model, judge, extra_litellm_params, rubric, None
    )
    if not group.trajectories:
        return group
    tools = next((t.tools for t in group.trajectories if t.tools), None)
    total: JudgeUsage | None = options.pop("usage", None)
    usage = JudgeUsage()
    settings = {**RULER_DEFAULTS, **options, "debug": debug, "usage": usage}
    try:
        scores, keys = await _ruler_with_keys(
            [judged_messages(t) for t in group.trajectories],
            chosen,
            extra,
            rubric_text,
            tools,
            **settings,
        )
    except JudgeError as error:
        if total is not None:
            total.add(usage)  # a failed judgement still cost its requests
        if not swallow_exceptions:
            raise
        logger.warning(
            "RULER could not score a group of %d trajectories, dropping it: %s",
            len(group.trajectories),
            error,
        )
        return None
    if total is not None:
        total.add(usage)
    return _scored_group(group, scores, keys, usage)


def _scored_group(
    group: TrajectoryGroup, scores: list[RulerScore], keys: list[str], usage: JudgeUsage
) -> TrajectoryGroup:
    """A copy of `group` rewarded by `scores`, naming the judge calls `keys`, with `usage`."""
    judge_cache_key: str | list[str] = keys[0] if len(keys) == 1 else keys
    scored = []
    for trajectory, result in zip(group.trajectories, scores, strict=True):
        metrics: dict[str, float | int | bool] = {
            **trajectory.metrics,
            "independent_reward": trajectory.reward,
            "ruler_score": result.score,
        }
        if result.position_gap is not None:
            metrics["ruler_position_gap"] = result.position_gap
        scored.append(
            trajectory.model_copy(
                update={
                    "reward": result.score,
                    "metrics": metrics,
                    "metadata": {**trajectory.metadata, "judge_cache_key": judge_cache_key},
                    "logs": [*trajectory.logs, f"RULER: {result.explanation}"],
                }
            )
        )
    new_group = TrajectoryGroup(scored, exceptions=group.exceptions, metadata=group.metadata)
    new_group.metrics = dict(group.metrics)
    for key, value in usage.metrics().items():
        new_group.metrics[key] = new_group.metrics.get(key, 0.0) + value
    return new_group
