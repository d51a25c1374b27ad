"""benchmarks/lora_decode.py on the tiny model: both dtypes, the three contenders, and PEFT's
and our layers' logits compared bit for bit (no timing is asserted: tiny figures mean nothing)."""

from __future__ import annotations

from tests.benchmarks import tiny_run


def test_the_tiny_run_compares_the_three_and_finds_the_logits_equal(tmp_path):
    result, printed = tiny_run("lora_decode.py", tmp_path / "lora_decode.json")
    assert [figure["dtype"] for figure in result["figures"]] == ["bfloat16", "float32"]
    for figure in result["figures"]:
        assert figure["adapter_layers"] == 14  # seven projections of the tiny model's two layers
        assert set(figure["ms_per_step"]) == {"base", "peft", "ours"}
        assert all(len(runs) == result["runs"] for runs in figure["runs_ms"].values())
        assert figure["logits_equal"] is True
    assert "<!-- lora_decode:start -->" in printed
