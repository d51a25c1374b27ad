"""Which metrics reach W&B: ART's rule (`art/model.py`, `_wandb_metrics_payload`, 0.5.23).

    a key reaches the W&B run when it is
      1. canonical       one of WANDB_CANONICAL_METRIC_KEYS below,
      2. a cost          its name (after the split) starts with "costs/",
      3. the user's own  a metric of the user's trajectories or groups, or a `model.log(...,
                         metrics=...)` key
    and every other key (the server's internals: rows, optimizer_steps, dropped/...) stays in
    the model's history (history.jsonl) only.

ART's canonical names are its own (`loss/train`, `time/step_wall_s`, `val/reward_std_dev`); the
table holds ours for the same quantities, under their split as the W&B run shows them:

    ART                                  here
    training_step                        training_step
    {train,val,test}/reward              {train,val,test}/reward
    {train,val,test}/reward_std_dev      {train,val,test}/reward_std
    {train,val,test}/exception_rate      {train,val,test}/exceptions  (a count here)
    loss/train, loss/entropy, loss/kl_*  train/loss, train/entropy, train/kl
    loss/grad_norm, loss/learning_rate   train/grad_norm, train/learning_rate
    loss/clipped_token_fraction          train/clip_fraction
    data/step_trainable_assistant_tokens train/trained_tokens
    time/step_wall_s                     train/step_seconds
    costs/cum/*                          <split>/costs/*  (no cumulative sums here)
"""

from __future__ import annotations

from collections.abc import Mapping, Set

METRIC_SPLITS = ("train", "val", "test")  # ART's; a split of the user's own is not canonical
WANDB_CANONICAL_METRIC_KEYS = frozenset(
    {
        "training_step",
        *(
            f"{split}/{metric}"
            for split in METRIC_SPLITS
            for metric in ("reward", "reward_std", "exceptions")
        ),
        *(
            f"train/{metric}"
            for metric in (
                "loss",
                "entropy",
                "kl",
                "grad_norm",
                "learning_rate",
                "clip_fraction",
                "trained_tokens",
                "step_seconds",
            )
        ),
    }
)
COST_PREFIX = "costs/"


def wandb_metrics(
    split: str, metrics: Mapping[str, float], user_keys: Set[str]
) -> dict[str, float]:
    """The part of a history row's metrics (`<split>/<key>`, as the trackers log them) that
    ART sends to W&B; `user_keys`: the row's keys (without the split) that are the user's."""
    return {
        key: value
        for key, value in metrics.items()
        if key in WANDB_CANONICAL_METRIC_KEYS
        or key.removeprefix(f"{split}/").startswith(COST_PREFIX)
        or key.removeprefix(f"{split}/") in user_keys
    }
