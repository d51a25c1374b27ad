"""Trackers: what watches a model's steps, configured on the model as ART configures them.

`TrainableModel(report_metrics=[...])` names them: each name is an entry point of the group
`art_trainer.trackers` (a package adds its own in its pyproject), each entry a callable that takes
`requested=` and returns a `StepObserver` (or None: off, nothing to watch). An observer object
may stand in the list as well. `report_metrics=None` (the default) builds the default trackers
unrequested: each is on when its settings are in the environment (Langfuse: LANGFUSE_PUBLIC_KEY,
...; W&B: WANDB_API_KEY, as ART), quiet or absent otherwise; `report_metrics=[]` builds none.

    langfuse   trajectories as Langfuse traces                     (langfuse/)
    wandb      metrics by split, config, trajectory tables (W&B)   (wandb/, extra [wandb])
    trackio    the same in Trackio's local store and dashboard     (trackio/, extra [trackio];
               only when named)

W&B and Trackio share `_runs.TrackerObserver`: one tracker run per model run name, resumed
under the same id, and log calls seen through `LogObserver.logged` with the recorded row.

The registry reads the entry points only: ours are declared in pyproject.toml like anyone
else's, so the client never names a tracker module. A default tracker this install does not
declare is absent; a named one that is not installed is an `UnsupportedOptionError`.

Why the trackers live in the client and not in `integrations/` (measured on issue 39): they
import nothing but `art_core` and httpx, a dependency already; each SDK (langfuse, wandb,
trackio) is an extra imported only when its tracker runs. `import art_core` loads this registry
(the model reads `report_metrics`) and `langfuse/` without its SDK, for `art.LangfuseExporter`,
`art.flush_langfuse` and `art.langfuse_stats` (about 2 % of `import art_core`); never `wandb/`
or `trackio/`. Langfuse is a default tracker and a model's deprecated `langfuse=` takes
an exporter, so the client would still name it; a move would add a sixth distribution root and
change the import paths users write (docs/langfuse.md, docs/trackers.md, the demo and
`art.LangfuseExporter`, which art_core could then no longer re-export).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

from art_core._observers import ObservedModel, StepObserver
from art_core.errors import UnsupportedOptionError
from art_core.trajectories import TrajectoryGroup

__all__ = [
    "DEFAULT_TRACKERS",
    "ENTRY_POINT_GROUP",
    "LogObserver",
    "observers_for",
    "tracker_links",
    "tracker_names",
]

ENTRY_POINT_GROUP = "art_trainer.trackers"
DEFAULT_TRACKERS = ("langfuse", "wandb")


@runtime_checkable
class LogObserver(Protocol):
    """An observer that also wants each `model.log` call's row as the backend recorded it
    (its step and metrics; `groups` empty for a metrics-only log)."""

    def logged(
        self,
        model: ObservedModel,
        groups: list[TrajectoryGroup],
        *,
        split: str,
        step: int,
        metrics: Mapping[str, float],
    ) -> None: ...


def tracker_links(observers: Sequence[object], model: ObservedModel) -> list[str]:
    """Where each tracker shows `model`'s run (a URL, or a local path and command)."""
    links = []
    for observer in observers:
        run_link = getattr(observer, "run_link", None)
        link = run_link(model) if callable(run_link) else None
        if link:
            links.append(str(link))
    return links


@functools.cache
def _installed() -> dict[str, str]:
    """Tracker name -> "module:attribute": the entry points of the group, ours among them."""
    return {entry.name: entry.value for entry in entry_points(group=ENTRY_POINT_GROUP)}


def _load(target: str) -> Callable[..., Any]:
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)  # type: ignore[no-any-return]


def tracker_names() -> list[str]:
    """The trackers installed here, by the name `report_metrics` takes."""
    return sorted(_installed())


def observers_for(report_metrics: Sequence[str | StepObserver] | None) -> list[StepObserver]:
    """The observers `report_metrics` names (see the module's docstring for the rule)."""
    if isinstance(report_metrics, str):
        raise UnsupportedOptionError(
            f"report_metrics={report_metrics!r}: give a list, e.g. report_metrics=[{report_metrics!r}]"
        )
    requested = report_metrics is not None
    observers: list[StepObserver] = []
    for item in DEFAULT_TRACKERS if report_metrics is None else report_metrics:
        if not isinstance(item, str):
            if not callable(getattr(item, "step_started", None)):
                raise UnsupportedOptionError(
                    f"report_metrics: {item!r} is neither a tracker name ({_known()}) nor a "
                    "StepObserver (an object with step_metrics and step_started)"
                )
            observers.append(item)
            continue
        target = _installed().get(item)
        if target is None and not requested:
            continue  # a default tracker this install does not have: absent, as documented
        if target is None:
            raise UnsupportedOptionError(
                f"report_metrics: no tracker named {item!r} is installed here ({_known()})."
            )
        observer = _load(target)(requested=requested)
        if observer is not None:  # a default tracker whose settings are absent
            observers.append(observer)
    return observers


def _known() -> str:
    names = tracker_names()
    return "installed: " + ", ".join(names) if names else "none is installed"
