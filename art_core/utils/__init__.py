"""ART's `art.utils`: training-loop helpers (`from art_core.utils import iterate_dataset`), and
ours: `scenario_hash` (a scenario's sha256, for the step's replay manifest).

The supervised fine-tuning helpers are in `art_core.utils.sft`, as ART's are in `art.utils.sft`.
"""

from art_core.utils._hashes import scenario_hash
from art_core.utils._jsonl import jsonl_lines
from art_core.utils._loops import DatasetBatch, iterate_dataset, limit_concurrency, retry

__all__ = [
    "DatasetBatch",
    "iterate_dataset",
    "jsonl_lines",
    "limit_concurrency",
    "retry",
    "scenario_hash",
]
