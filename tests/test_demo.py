"""`make demo`'s words follow its code: the settings and the reward the getting-started page and
the report state, and its choice of no dynamic sampling, which the trainer's advice respects."""

from __future__ import annotations

import importlib.util
import logging
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

import art_core as art
from art_core.utils._signal import _HINTED, hint_zero_variance

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@pytest.fixture
def demo(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    spec = importlib.util.spec_from_file_location("example_demo", EXAMPLES / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "example_demo", module)
    spec.loader.exec_module(module)
    return module


def flat_text(path: Path) -> str:
    return re.sub(r"\s+", " ", path.read_text(encoding="utf-8"))


def test_the_getting_started_page_states_the_demos_settings_and_reward(demo: ModuleType):
    page = flat_text(ROOT / "docs" / "getting-started.md")
    assert demo.settings_sentence(demo.parse_args([])) in page
    assert f"The reward: {demo.REWARD_RULE}." in page


@pytest.mark.parametrize(
    ("reply", "reward"),
    [("3 + 4 = 7", 1.0), ("4 + 3 = 7.", 1.0), ("3 + 4 = 7, since 3 + 4 is 7", 0.5),
     ("The sum is 7", 0.5), ("3 + 4 = 8", 0.0), ("Seven", 0.0)],
)  # fmt: skip
def test_the_reward_rule_in_words_is_what_score_pays(demo: ModuleType, reply: str, reward: float):
    assert demo.REWARD_RULE.startswith('1 for exactly the equation "a + b = sum"')
    assert "0.5 for the right sum among other text, 0 otherwise" in demo.REWARD_RULE
    assert demo.score(demo.Question(3, 4), reply)["reward"] == reward


async def gathered_counts(signal: art.GroupSignal | None) -> dict[str, float]:
    """A demo-shaped step gathered as the demo gathers it, every group all-equal (a base model
    that never answers in the asked form); the gather's counts, which backend.train reads."""
    batch = next(art.iterate_dataset(list(range(8)), 8, use_tqdm=False, signal=signal))

    async def zero() -> art.Trajectory:
        return art.Trajectory(messages_and_choices=[], reward=0.0)

    groups = await art.gather_trajectory_groups(
        batch.groups(lambda _: art.TrajectoryGroup(zero() for _ in range(8))), pbar_desc=None
    )
    return dict(getattr(groups, "counts", None) or {})


async def test_the_demo_chose_no_dynamic_sampling_and_is_not_advised_to_use_it(
    demo: ModuleType, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.WARNING, logger="art_core.signal")
    args = demo.parse_args([])
    assert args.min_trainable_groups == 0  # off by default, on purpose (measured)
    signal = demo.group_signal(args)
    assert signal.min_trainable_groups is None and not signal.skip_settled  # it only counts
    model = type("M", (), {"name": "demo-hint-test"})()
    all_equal = {"groups/zero_variance": 8.0, "groups/trainable": 0.0}

    _HINTED.discard(model.name)
    assert not hint_zero_variance(model, all_equal, await gathered_counts(signal))
    assert "GroupSignal" not in caplog.text
    # The same step gathered without any signal: a program that never chose is advised.
    assert hint_zero_variance(model, all_equal, await gathered_counts(None))
    assert "GroupSignal" in caplog.text
    _HINTED.discard(model.name)


def test_with_min_trainable_groups_the_demo_samples_more(demo: ModuleType):
    signal = demo.group_signal(demo.parse_args(["--min-trainable-groups", "4"]))
    assert signal.min_trainable_groups == 4 and signal.max_groups_per_step == 16
