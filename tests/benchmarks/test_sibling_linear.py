"""benchmarks/sibling_linear.py on the tiny model (every layer packed), bf16: decode and train
both ways, the logits and the loss equal bit for bit (no timing is asserted: tiny figures
mean nothing)."""

from __future__ import annotations

from tests.benchmarks import tiny_run


def test_the_tiny_run_measures_both_ways_and_finds_them_equal(tmp_path):
    result, printed = tiny_run("sibling_linear.py", tmp_path / "sibling_linear.json")
    assert [figure["dtype"] for figure in result["figures"]] == ["bfloat16"]
    for figure in result["figures"]:
        assert figure["groups"] == 4  # q/k/v and gate/up of the tiny model's two layers
        assert set(figure["runs"]) == {
            "decode_grouped",
            "decode_alone",
            "train_grouped",
            "train_alone",
        }
        assert all(len(runs) == result["runs"] for runs in figure["runs"].values())
        assert figure["equal"] is True
    assert "<!-- sibling_linear:start -->" in printed
