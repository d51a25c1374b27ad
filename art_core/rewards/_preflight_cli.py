"""`art preflight`: the command line of `art.preflight` (a rollout function, a scenario file,
the policy's URL), its exit status the verdict."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from art_core._arguments import flag_values
from art_core.errors import ArtError
from art_core.model import Model
from art_core.rewards._preflight import PreflightError, PreflightRollout, preflight
from art_core.utils._jsonl import jsonl_lines

CLI_USAGE = """art preflight FILE.py:FUNCTION | MODULE:FUNCTION --scenarios FILE.jsonl
                     --base-url URL --model NAME [--api-key KEY]
                     [--judge PROVIDER/MODEL | --judge-base-url URL --judge-model NAME]
                     [--groups 2] [--rollouts-per-group 4] [--steps 10] [--groups-per-step N]
                     [--train-seconds-per-step S] [--json]

FUNCTION is `async def rollout(model, scenario) -> art.Trajectory`; each line of the JSONL file
is one scenario, passed to it as parsed JSON. The model is `art.Model(name=--model,
base_url=--base-url)`. Exit status: 0 when the verdict is "likely to learn" or "may learn
slowly", 1 when it will not (or is unlikely to) learn, 2 for a usage error."""


def preflight_command(argv: list[str]) -> int:
    """`art preflight ...`: load the rollout and the scenarios, run `preflight`, print the result."""
    parser = argparse.ArgumentParser(prog="art preflight", usage=CLI_USAGE)
    parser.add_argument("rollout", help="FILE.py:FUNCTION or MODULE:FUNCTION")
    parser.add_argument("--scenarios", required=True, help="a JSONL file, one scenario a line")
    parser.add_argument("--base-url", required=True, help="the policy's OpenAI-compatible URL")
    parser.add_argument("--model", required=True, help="the policy's model name at that URL")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--judge", default=None, help="'<provider>/<model>': RULER judges")
    parser.add_argument("--judge-base-url", default=None)
    parser.add_argument("--judge-model", default=None)
    parser.add_argument("--judge-api-key", default=None)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--rollouts-per-group", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--groups-per-step", type=int, default=None)
    parser.add_argument("--train-seconds-per-step", type=float, default=None)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    try:
        rollout = load_function(args.rollout)
        scenarios = load_jsonl(args.scenarios)
        judge: Model | str | None = args.judge
        if args.judge_base_url or args.judge_model:
            if not (args.judge_base_url and args.judge_model) or args.judge:
                raise PreflightError(
                    "give either --judge PROVIDER/MODEL or both --judge-base-url and --judge-model"
                )
            judge = Model(
                name=args.judge_model, base_url=args.judge_base_url, api_key=args.judge_api_key
            )
        model = Model(name=args.model, base_url=args.base_url, api_key=args.api_key)
        options = "groups rollouts_per_group steps groups_per_step train_seconds_per_step"
        result = asyncio.run(
            preflight(model, rollout, scenarios, judge=judge, **flag_values(args, options))
        )
    except ArtError as error:
        print(f"art preflight: {error}", file=sys.stderr)
        return 2
    print(result.to_json() if args.json else result.text())
    return 0 if result.will_learn else 1


def load_function(spec: str) -> PreflightRollout:
    """`path/to/file.py:name` or `package.module:name`; the file's folder goes on sys.path so
    that the file's own sibling imports work."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise PreflightError(f"the rollout is FILE.py:FUNCTION or MODULE:FUNCTION; got {spec!r}")
    if where.endswith(".py"):
        path = Path(where).resolve()
        if not path.is_file():
            raise PreflightError(f"no such file: {where}")
        sys.path.insert(0, str(path.parent))
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[path.stem] = module
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as error:
            raise PreflightError(f"cannot import {where!r}: {error}") from error
    function = getattr(module, name, None)
    if not callable(function):
        raise PreflightError(f"{where} has no function {name!r}")
    return function  # type: ignore[no-any-return]


def load_jsonl(path: str) -> list[Any]:
    """One JSON value a line (blank lines skipped); a bad line is named."""
    return [
        value
        for _, _, value in jsonl_lines(
            path, lambda message, _: PreflightError(message), what="scenarios file"
        )
    ]
