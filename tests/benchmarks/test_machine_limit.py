"""benchmarks/machine_limit.py on the tiny model: the JSON the published section is made from
carries every figure, its share of the peak, the load around it and the profiles (no timing is
asserted: tiny figures mean nothing)."""

from __future__ import annotations

from tests.benchmarks import tiny_run

BUCKETS = {
    "matmul", "attention", "lora", "sampling", "rows", "loss", "optimizer", "copies", "views",
    "elementwise", "python",
}  # fmt: skip


def test_the_tiny_run_writes_every_figure_as_a_share_of_the_peak_and_the_profiles(tmp_path):
    result, printed = tiny_run("machine_limit.py", tmp_path / "machine_limit.json")

    assert set(result["matmul_peak"]) == {"float32", "bfloat16"}
    assert all(peak["flops_per_s"] > 0 for peak in result["matmul_peak"].values())
    assert len(result["machine"]["torch_threads"]) == 1  # every figure on one thread count

    decoded = {
        (f["contender"], f["dtype"], f["rows"], bool(f.get("adapter"))) for f in result["decode"]
    }
    for dtype in ("float32", "bfloat16"):
        for rows in result["workload"]["rows"]:
            assert {("ours", dtype, rows, False), ("hf", dtype, rows, False)} <= decoded
    assert ("ours", "float32", result["workload"]["rows"][0], True) in decoded
    floors = {(f["kernel"], f["dtype"], f["rows"]) for f in result["linear_floor"]}
    assert floors == {
        (k, d, r)
        for k in ("dense", "packed")
        for d in ("float32", "bfloat16")
        for r in result["workload"]["rows"]
    }
    for figure in result["decode"]:  # each step beside the floor of its dtype and rows
        assert figure["linear_floor_s"] > 0 and figure["share_of_linear_floor"] > 0, figure
    assert {f["dtype"] for f in result["train"]} == {"float32", "bfloat16"}
    for figure in [*result["decode"], *result["train"]]:
        for key in ("conventional_share_of_peak", "counted_share_of_peak", "other_cores"):
            assert figure[key] >= 0, (key, figure)
        assert len(figure["loadavg_before"]) == len(figure["loadavg_after"]) == 3

    assert set(result["profiles"]) == {"decode", "decode_lora", "train"}
    for name, profile in result["profiles"].items():
        assert set(profile["buckets"]) == BUCKETS, name
        assert 0.99 <= sum(b["share"] for b in profile["buckets"].values()) <= 1.01, name
        assert 0 < len(profile["top_ops"]) <= 20
    assert result["profiles"]["decode_lora"]["buckets"]["lora"]["share"] > 0
    assert result["profiles"]["decode"]["buckets"]["lora"]["share"] == 0
    assert result["profiles"]["train"]["buckets"]["optimizer"]["share"] > 0

    assert "<!-- machine_limit:start -->" in printed  # the section renders from it
