"""Rewards without reward code: RULER (a judge ranks a group), generated scenarios, AutoRL and
preflight, over one structured-call layer (JSON-schema answers, one re-ask, usage, a disk cache).

ART's `art.rewards` holds RULER; `from art_core.rewards import ruler_score_group` as there.
"""

from art_core.errors import PreflightError
from art_core.rewards._autorl import AutoRLResult, autorl
from art_core.rewards._cache import ResponseCache
from art_core.rewards._judge_models import judge_or_base_model, resolve_model
from art_core.rewards._judge_usage import JudgeUsage
from art_core.rewards._preflight import PreflightResult, preflight
from art_core.rewards._ruler_prompt import DEFAULT_RUBRIC
from art_core.rewards._run import (
    Rollout,
    RunOutcome,
    RunSettings,
    TrainingRun,
    WarmStart,
    group_scorer,
    judge_answer,
)
from art_core.rewards._scenarios import (
    Scenario,
    generate_scenarios,
    load_scenarios,
    save_scenarios,
    split_scenarios,
)
from art_core.rewards.ruler import RulerScore, ruler, ruler_score_group

__all__ = [
    "DEFAULT_RUBRIC",
    "AutoRLResult",
    "JudgeUsage",
    "PreflightError",
    "PreflightResult",
    "ResponseCache",
    "Rollout",
    "RulerScore",
    "RunOutcome",
    "RunSettings",
    "Scenario",
    "TrainingRun",
    "WarmStart",
    "autorl",
    "generate_scenarios",
    "group_scorer",
    "judge_answer",
    "judge_or_base_model",
    "load_scenarios",
    "preflight",
    "resolve_model",
    "ruler",
    "ruler_score_group",
    "save_scenarios",
    "split_scenarios",
]
