"""The review app's pages (GET, HTML): a model's pages and a step's pages, each group attached
by one function over the store's root.

    add_model_pages   /<project>/<name>/ (steps, metrics, held steps), /search, /diff
    add_step_pages    /<project>/<name>/steps/<split>/<step>/ and its groups and trajectories

The pages are rendered by `_pages` and `_diff_page`; the forms on them post to
`_decision_routes`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from art_backend._errors import InvalidRequestError, StoreFileDamagedError
from art_backend._unicode import TolerantHTMLResponse, TolerantJSONResponse
from art_backend.review._browse import StepEntry, list_steps, load_state, load_step, open_model
from art_backend.review._decision_routes import reviewer, wants_json
from art_backend.review._diff import filter_examples, load_step_diff
from art_backend.review._diff_page import DiffQuery, diff_page
from art_backend.review._filters import TrajectoryFilter
from art_backend.review._pages import (
    SEARCH_LIMIT,
    group_page,
    model_page,
    search_page,
    step_page,
    trajectory_page,
)
from art_backend.store._checkpoints import ModelStore
from art_backend.store._review_decisions import list_pending, read_decisions, review_state


def add_model_pages(app: FastAPI, root: Path) -> None:
    """A model's page, its search across steps and its diff of two steps."""

    @app.get("/{project}/{name}", response_class=TolerantHTMLResponse)
    @app.get("/{project}/{name}/", response_class=TolerantHTMLResponse)
    def model(project: str, name: str, request: Request) -> str:
        store = open_model(root, project, name)
        query = dict(request.query_params)
        extra = set(query) - {"metrics"}
        if extra or query.get("metrics", "all") != "all":
            raise InvalidRequestError(
                "This page takes only `metrics=all` (plot every step metric).", param="metrics"
            )
        decisions = read_decisions(store.dir)
        return model_page(
            store,
            list_steps(store),
            store.read_history(),
            list_pending(store.dir),
            review_state(decisions).approved,
            decisions,
            all_metrics="metrics" in query,
            reviewer=reviewer(request),
        )

    @app.get("/{project}/{name}/search", response_class=TolerantHTMLResponse)
    def search(project: str, name: str, request: Request) -> str:
        store = open_model(root, project, name)
        query = dict(request.query_params)
        steps = list_steps(store)
        results, damaged = _search(store, steps, TrajectoryFilter.from_query(query))
        splits = sorted({entry.split for entry in steps})
        return search_page(
            store,
            results[:SEARCH_LIMIT],
            query,
            splits,
            truncated=len(results) > SEARCH_LIMIT,
            damaged=damaged,
        )

    @app.get("/{project}/{name}/diff", response_model=None)
    def diff(project: str, name: str, request: Request) -> Response:
        store = open_model(root, project, name)
        query = dict(request.query_params)
        wanted = DiffQuery.parse(query)
        answer_json = wants_json(request)
        if wanted.from_step is None or wanted.to_step is None:
            if answer_json:
                raise InvalidRequestError(
                    "Give `from` and `to`: the two steps to compare.", param="from"
                )
            result, shown = None, []
        else:
            result = load_step_diff(
                store, wanted.split, wanted.from_step, wanted.to_step, wanted.options
            )
            shown = filter_examples(result, wanted.tag, wanted.text)
            if answer_json:
                return TolerantJSONResponse(result.to_json(shown))
        steps_by_split: dict[str, list[int]] = {}
        for split_name, number, _ in store.trajectory_files():
            steps_by_split.setdefault(split_name, []).append(number)
        html = diff_page(store, query, wanted, steps_by_split, result, shown)
        return TolerantHTMLResponse(html)


def _search(
    store: ModelStore, steps: list[StepEntry], wanted: TrajectoryFilter
) -> tuple[list[tuple[str, str, Any]], list[str]]:
    """The trajectories `wanted` matches, step after step, until more than the page shows; and
    the steps whose file is damaged (searched as far as readable)."""
    state = load_state(store)
    results: list[tuple[str, str, Any]] = []
    damaged: list[str] = []
    for entry in steps:
        if wanted.split and entry.split != wanted.split:
            continue
        try:
            view = load_step(store, entry.split, str(entry.step), state)
        except StoreFileDamagedError:  # a folder, or unreadable: nothing in it to search
            damaged.append(f"{entry.split} step {entry.step}")
            continue
        if view.damage:
            damaged.append(f"{entry.split} step {entry.step}")
        for group in wanted.apply(view.groups):
            results += [(entry.split, str(entry.step), t) for t in group.trajectories]
        if len(results) > SEARCH_LIMIT:
            break
    return results, damaged


def add_step_pages(app: FastAPI, root: Path) -> None:
    """A step's page (filtered by the query), one of its groups, one of its trajectories."""

    @app.get("/{project}/{name}/steps/{split}/{step}", response_class=TolerantHTMLResponse)
    def step(project: str, name: str, split: str, step: str, request: Request) -> str:
        store = open_model(root, project, name)
        query = dict(request.query_params)
        wanted = TrajectoryFilter.from_query(query)
        state = load_state(store)
        view = load_step(store, split, step, state)
        shown = wanted.apply(view.groups) if wanted.active else view.groups
        return step_page(store, view, shown, query, state.approved, reviewer(request))

    @app.get(
        "/{project}/{name}/steps/{split}/{step}/groups/{group}", response_class=TolerantHTMLResponse
    )
    def group(project: str, name: str, split: str, step: str, group: str, request: Request) -> str:
        store = open_model(root, project, name)
        view = load_step(store, split, step, load_state(store))
        return group_page(store, view, view.group(group), reviewer(request))

    @app.get(
        "/{project}/{name}/steps/{split}/{step}/trajectories/{trajectory_id:path}",
        response_class=TolerantHTMLResponse,
    )
    def trajectory(
        project: str, name: str, split: str, step: str, trajectory_id: str, request: Request
    ) -> str:
        store = open_model(root, project, name)
        view = load_step(store, split, step, load_state(store))
        return trajectory_page(store, view, view.trajectory(trajectory_id), reviewer(request))
