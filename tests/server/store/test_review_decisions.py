"""Reviewers' decisions and held steps on disk: append-only, the latest decision wins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from art_backend.store._review_decisions import (
    append_decision,
    list_pending,
    read_decisions,
    read_pending,
    read_review_state,
    remove_all_pending,
    remove_pending,
    write_pending,
)


def test_decisions_are_appended_with_their_time_and_replayed_in_order(tmp_path: Path):
    append_decision(tmp_path, {"action": "flag_trajectory", "trajectory_id": "a", "reason": "r1"})
    append_decision(tmp_path, {"action": "override_reward", "trajectory_id": "b", "reward": 0.5})
    append_decision(tmp_path, {"action": "flag_group", "trajectory_ids": ["c", "d"], "reason": "g"})
    append_decision(tmp_path, {"action": "withdraw", "trajectory_id": "a", "reason": "my mistake"})

    rows = read_decisions(tmp_path)
    assert [row["action"] for row in rows] == [
        "flag_trajectory",
        "override_reward",
        "flag_group",
        "withdraw",
    ]
    assert all(isinstance(row["at"], float) for row in rows)
    state = read_review_state(tmp_path)
    assert state.trajectory_flag("a") is None  # withdrawn, but the flag stays in the file
    assert state.override("b")["reward"] == 0.5
    # A group matches by any member: a re-submitted group with one of its trajectories is flagged.
    assert state.group_flag(["x", "d"])["reason"] == "g"
    assert state.group_flag(["x", "y"]) is None


def test_a_group_flag_is_withdrawn_by_its_members(tmp_path: Path):
    append_decision(tmp_path, {"action": "flag_group", "trajectory_ids": ["c", "d"], "reason": "g"})
    append_decision(tmp_path, {"action": "withdraw", "trajectory_ids": ["c", "d"], "reason": "ok"})
    assert read_review_state(tmp_path).group_flag(["c"]) is None


def test_a_torn_last_line_is_skipped_and_unknown_actions_refused(tmp_path: Path):
    append_decision(tmp_path, {"action": "flag_trajectory", "trajectory_id": "a", "reason": "r"})
    with open(tmp_path / "review" / "decisions.jsonl", "a") as out:
        out.write('{"action": "flag_traj')  # a crash mid-write
    assert len(read_decisions(tmp_path)) == 1
    with pytest.raises(ValueError, match="unknown review action"):
        append_decision(tmp_path, {"action": "delete_everything"})


def test_a_held_step_is_written_listed_read_and_removed(tmp_path: Path):
    rows = [
        {"group": 0, "id": "a", "reward": 1.0},
        {"group": 0, "id": "b", "reward": 0.0},
        {"group": 1, "exception": "ValueError: boom"},
    ]
    pending = write_pending(tmp_path, step=3, hold_seconds=60, rows=rows)
    assert (pending.groups, pending.trajectories, pending.step) == (2, 2, 3)
    assert [p.id for p in list_pending(tmp_path)] == [pending.id]
    held = read_pending(tmp_path, pending.id)
    assert held is not None and held[1] == rows
    assert read_pending(tmp_path, "../../etc") is None  # ids are checked before touching a path

    append_decision(tmp_path, {"action": "approve", "pending": pending.id})
    assert pending.id in read_review_state(tmp_path).approved
    remove_pending(tmp_path, pending.id)
    assert list_pending(tmp_path) == [] and read_pending(tmp_path, pending.id) is None


def test_holds_left_by_a_stopped_server_are_forgotten(tmp_path: Path):
    for _ in range(2):
        write_pending(tmp_path, step=0, hold_seconds=60, rows=[])
    assert remove_all_pending(tmp_path) == 2
    assert list_pending(tmp_path) == []
    description = json.dumps({"not": "a pending step"})
    (tmp_path / "review" / "pending" / "abcdefabcdef.json").write_text(description)
    assert list_pending(tmp_path) == []  # unreadable descriptions are not listed
