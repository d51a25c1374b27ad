"""benchmarks/long_prompt.py on the tiny model, with this checkout as its own baseline: every
contender measured at every length, and the baseline's token and logprob found equal to ours
(no timing is asserted: tiny figures mean nothing)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.benchmarks import ROOT


def test_the_tiny_run_measures_every_contender_and_finds_the_baseline_equal(tmp_path):
    out = tmp_path / "long_prompt.json"
    script = [sys.executable, "benchmarks/long_prompt.py", "--shape", "tiny"]
    done = subprocess.run(
        [*script, "--baseline", str(ROOT), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [row["prompt_tokens"] for row in result["rows"]] == [40, 200]
    for row in result["rows"]:
        assert set(row["seconds"]) == {"ours", "ours_not_invariant", "generate", "baseline"}
        assert all(seconds > 0 for seconds in row["seconds"].values())
        assert row["equal_to_baseline"] is True
    assert "<!-- long_prompt:start -->" in done.stdout
