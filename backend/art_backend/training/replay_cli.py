"""`art replay`: train one recorded step again from its saved inputs and check the adapter.

    art replay --model NAME --step N [--path .art] [--project P] [--threads K]
               [--tolerance X] [--base-model FOLDER] [--device cpu|cuda]

Reads what `art-server` wrote under --path (manifest.json, the checkpoints of steps N-1 and N);
loads the base model itself, so run it where no server trains on the same cores. Exit code 0:
the adapter matches (bit-exact, or within the stated tolerance where bit-exact is not expected);
1: it does not, or the saved inputs changed; 2: the step cannot be replayed (the message says
why and what to do).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from art_backend._errors import BackendError
from art_core._arguments import flag_values, non_negative_float, positive_int

if TYPE_CHECKING:
    from art_backend.training._replay import ReplayReport


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, replay the step, print the verdict."""
    parser = argparse.ArgumentParser(prog="art replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the model's name")
    parser.add_argument("--step", required=True, type=positive_int, help="the step to replay")
    parser.add_argument("--path", default=".art", type=Path, help="the folder art-server used")
    parser.add_argument("--project", help="the model's project (when several have the name)")
    parser.add_argument(
        "--threads",
        type=thread_count,
        help="torch threads, at most 4 per core or 256 (default: the step's own count)",
    )
    parser.add_argument(
        "--tolerance",
        type=non_negative_float,
        help="max |delta| per weight accepted where bit-exact is not expected "
        "(default: 1%% of the step's learning rate)",
    )
    parser.add_argument("--base-model", type=Path, help="a folder with the run's base model files")
    parser.add_argument("--device", choices=["cpu", "cuda"], help="default: the step's device")
    args = parser.parse_args(argv)

    from transformers.utils import logging as transformers_logging

    from art_backend.training._replay import replay_step

    transformers_logging.disable_progress_bar()  # the verdict, not a loading bar, on stderr
    transformers_logging.set_verbosity_error()
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' renames
    try:
        report = replay_step(
            args.path,
            args.model,
            args.step,
            **flag_values(args, "project threads tolerance base_model device"),
        )
    except BackendError as error:
        print(f"art replay: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    return _verdict(report)


def thread_count(text: str) -> int:
    """An argparse type: a whole number from 1 to `max_threads()` (torch crashes far past it)."""
    from art_backend.engines._thread_settings import max_threads

    value = positive_int(text)
    if value > max_threads():
        raise argparse.ArgumentTypeError(
            f"{value} is more than {max_threads()} (4 per core, at least 256): give a count near "
            "the number of cores, or leave it out to use the step's own count"
        )
    return value


def _verdict(report: ReplayReport) -> int:
    """Print whether the replayed adapter matches the recorded one; 0 if it does, else 1."""
    where = f"{report.project}/{report.name} step {report.step}"
    for reason in report.why_not_exact:
        print(f"warning: bit-exact not promised: {reason}", file=sys.stderr)
    for note in report.notes:
        print(f"note: {note}", file=sys.stderr)
    if report.bit_exact:
        print(f"match: {where} replayed bit-exactly (adapter sha256 {report.replayed_sha256})")
        return 0
    worst = max(report.max_delta.values(), default=float("nan"))
    if report.ok:
        print(
            f"match within tolerance: {where}: max |delta| {worst:.3g} <= {report.tolerance:.3g} "
            f"(adapter sha256 {report.replayed_sha256}, recorded {report.expected_sha256})"
        )
        return 0
    print(
        f"mismatch: {where}: adapter sha256 {report.replayed_sha256}, recorded "
        f"{report.expected_sha256}; max |delta| {worst:.3g}, tolerance {report.tolerance:.3g}"
        + ("" if report.inputs_ok else "; the saved inputs changed since the step")
    )
    differing = {name: delta for name, delta in report.max_delta.items() if delta > 0}
    for name, delta in differing.items():
        print(f"  {name}: max |delta| {delta:.3g}")
    if report.max_delta and not differing:
        print(
            f"  all {len(report.max_delta)} tensors equal checkpoint {report.step}'s: the "
            "recorded hash changed after the step, or the checkpoint's adapter did"
        )
    return 1


if __name__ == "__main__":
    sys.exit(main())
