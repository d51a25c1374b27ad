"""`art diff`: how a model's held-out answers changed between two steps, over a `.art` folder.

    art diff --model NAME --from N --to M [--split val] [--path .art] [--json]
             [--metric NAME] [--threshold X] [--length-margin R] [--tag TAG]

Reads the trajectories `model.log(groups, split="val")` wrote at each step (what the review
page's diff shows at `/review/<project>/<name>/diff`); loads no model. Prints the counts per tag,
then each changed example's two answers; `--json` prints the same as the page's JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from art_backend._errors import BackendError, StoreNotFoundError
from art_backend.review._browse import list_models, message_text, open_model
from art_backend.review._diff import (
    TAG_FILTERS,
    TAGS,
    Answer,
    CorrectnessRule,
    DiffOptions,
    StepDiff,
    filter_examples,
    load_step_diff,
)
from art_backend.store._checkpoints import ModelStore

TAG_CHOICES = [*TAG_FILTERS, "all"]
SNIPPET = 160  # characters of each answer printed per example


def find_model(root: Path, model: str) -> ModelStore:
    """`project/name`, or a name that one project under `root` holds; else a clear error."""
    if "/" in model:
        project, _, name = model.partition("/")
        return open_model(root, project, name)
    matches = [m for m in list_models(root) if m.name == model]
    if len(matches) == 1:
        return open_model(root, matches[0].project, model)
    known = [f"{m.project}/{m.name}" for m in list_models(root)]
    if matches:
        raise StoreNotFoundError(
            f"Several projects under {root} have a model {model!r}: give --model as "
            f"PROJECT/NAME, one of {', '.join(f'{m.project}/{m.name}' for m in matches)}."
        )
    raise StoreNotFoundError(
        f"No model {model!r} under {root}: "
        + (f"the models there are {', '.join(known)}." if known else "it holds no models yet.")
        + " Give --path the folder art-server used as its --path (default .art)."
    )


def format_diff(store: ModelStore, diff: StepDiff, shown_tag: str) -> str:
    """The counts, then each shown example: its tags, prompt, and the two answers."""
    counts = diff.counts
    lines = [
        f"{store.project}/{store.name} {diff.split}: step {diff.from_step} -> step "
        f"{diff.to_step}, {len(diff.examples)} examples compared, right means "
        f"{diff.options.rule.describe()}",
        "  "
        + ", ".join(f"{label} {counts[tag]}" for tag, label in TAGS.items())
        + f", unchanged {counts['unchanged']}",
    ]
    lines += [f"  note: {note}" for note in diff.notes]
    if diff.only_before or diff.only_after:
        lines.append(
            f"  not compared: {diff.only_before} only at step {diff.from_step}, "
            f"{diff.only_after} only at step {diff.to_step}"
        )
    shown = filter_examples(diff, "" if shown_tag == "all" else shown_tag)
    lines.append(
        f"\n{len(shown)} examples ({shown_tag}):" if shown else f"\nno {shown_tag} examples"
    )
    for example in shown:
        tags = ", ".join(TAGS[t] for t in example.tags) or "unchanged"
        users = [m for m in example.prompt if m.get("role") == "user"]
        title = _one_line(message_text(users[-1]) if users else example.key)
        lines.append(f"\n[{tags}] {title}")
        lines.append(_answer_line(diff.from_step, example.before))
        lines.append(_answer_line(diff.to_step, example.after))
    return "\n".join(lines)


def _answer_line(step: int, answer: Answer) -> str:
    verdict = {True: "right", False: "wrong", None: "not judged"}[answer.right]
    reward = "-" if answer.reward is None else f"{answer.reward:g}"
    tools = ", ".join(answer.tools) or "none"
    return (
        f"  step {step} (reward {reward}, {verdict}, {answer.format}, {answer.length} chars, "
        f"tools: {tools}): {_one_line(answer.text)}"
    )


def _one_line(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= SNIPPET else flat[: SNIPPET - 1] + "…"


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, compare the two steps, print; 2 with a message on bad input."""
    parser = argparse.ArgumentParser(prog="art diff", description=__doc__)
    parser.add_argument("--model", required=True, help="NAME or PROJECT/NAME")
    parser.add_argument("--from", dest="from_step", type=int, required=True, metavar="N")
    parser.add_argument("--to", dest="to_step", type=int, required=True, metavar="M")
    parser.add_argument("--split", default="val", help="the logged split (default val)")
    parser.add_argument("--path", default=".art", type=Path, help="the folder art-server wrote")
    parser.add_argument("--json", action="store_true", help="print the diff as JSON")
    parser.add_argument(
        "--metric", help="right when this trajectory metric (default: the reward) is above..."
    )
    parser.add_argument("--threshold", type=float, default=0.0, help="...this (default 0)")
    parser.add_argument(
        "--length-margin",
        type=float,
        default=DiffOptions.length_margin,
        help="length changed: the longer answer over (1 + R) times the shorter (default 0.5)",
    )
    parser.add_argument(
        "--tag",
        choices=TAG_CHOICES,
        help="which examples to print (default: changed ones; with --json, all)",
    )
    args = parser.parse_args(argv)
    if not args.path.is_dir():
        parser.exit(
            2,
            f"art diff: error: no folder {str(args.path)!r}: give --path the folder art-server "
            "used as its --path (default .art).\n",
        )
    try:
        options = DiffOptions(
            rule=CorrectnessRule(metric=args.metric, threshold=args.threshold),
            length_margin=args.length_margin,
        )
        store = find_model(args.path, args.model)
        diff = load_step_diff(store, args.split, args.from_step, args.to_step, options)
    except BackendError as error:
        print(f"art diff: error: {error.message}", file=sys.stderr)
        return 2
    if args.json:
        shown = filter_examples(diff, "" if args.tag in (None, "all") else args.tag)
        print(json.dumps(diff.to_json(shown), indent=2, ensure_ascii=False))
    else:
        print(format_diff(store, diff, args.tag or "changed"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
