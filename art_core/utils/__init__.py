"""ART's `art.utils`: training-loop helpers (`from art_core.utils import iterate_dataset`), and
ours: `scenario_hash` (a scenario's sha256, for the step's replay manifest) and `GroupSignal`
(skip scenarios that stay all-equal, sample more until a step has groups with mixed rewards).

The supervised fine-tuning helpers are in `art_core.utils.sft`, as ART's are in `art.utils.sft`.
"""

from art_core.utils._hashes import scenario_hash
from art_core.utils._jsonl import jsonl_lines
from art_core.utils._loops import (
    BatchGroups,
    DatasetBatch,
    iterate_dataset,
    limit_concurrency,
    retry,
)
from art_core.utils._signal import GroupSignal, carries_signal

__all__ = [
    "BatchGroups",
    "DatasetBatch",
    "GroupSignal",
    "carries_signal",
    "iterate_dataset",
    "jsonl_lines",
    "limit_concurrency",
    "retry",
    "scenario_hash",
]
