"""Training rows: recorded turns -> sequences -> padded rows -> micro-batches, on hand-made tokens."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from art_backend.training._grpo import loss_denominator, loss_preset, policy_loss
from art_backend.training._logprobs import (
    CHUNK_POSITIONS,
    scored_positions,
    token_logprobs,
    token_logprobs_and_entropy,
)
from art_backend.training._rows import (
    DROP_REASONS,
    Rows,
    Sequence,
    TrajectoryTurns,
    TurnRecord,
    build_sequences,
    micro_batches,
    pack_rows,
    turns_from_record,
)


def turn(prompt: list[int], sampled: list[int], finish_reason: str = "stop") -> TurnRecord:
    """A turn whose sampler logprob of token t is -t/10, so every position is recognisable."""
    return TurnRecord(prompt, sampled, [-t / 10 for t in sampled], finish_reason)


def trajectory(*turns: TurnRecord, advantage: float = 0.5, name: str = "t0", group: int = 3):
    return TrajectoryTurns(trajectory_id=name, group_id=group, advantage=advantage, turns=[*turns])


def sequence(
    length: int, *, trained: int = 1, truncated: bool = False, name: str = "s"
) -> Sequence:
    """A sequence of `length` tokens whose last `trained` tokens were sampled."""
    mask = torch.zeros(length, dtype=torch.bool)
    mask[length - trained :] = True
    return Sequence(
        input_ids=torch.arange(1, length + 1),
        trained_mask=mask,
        old_logprobs=torch.where(mask, -1.0, 0.0),
        advantage=1.0,
        trajectory_id=name,
        group_id=0,
        truncated=truncated,
    )


def as_lists(s: Sequence) -> tuple[list[int], list[int], list[float]]:
    return s.input_ids.tolist(), s.trained_mask.int().tolist(), s.old_logprobs.tolist()


# --- build_sequences ----------------------------------------------------------------------------


def test_single_turn_trains_only_the_sampled_tokens():
    [s] = build_sequences(trajectory(turn([1, 2, 3], [40, 50]), advantage=-1.5))
    ids, mask, old = as_lists(s)
    assert ids == [1, 2, 3, 40, 50]
    assert mask == [0, 0, 0, 1, 1]
    assert old == pytest.approx([0, 0, 0, -4.0, -5.0])
    assert (s.advantage, s.trajectory_id, s.group_id, s.truncated) == (-1.5, "t0", 3, False)


def test_turns_that_extend_each_other_become_one_sequence_with_context_masked():
    # turn 1 samples 10 11; the tool result 7 8 follows; turn 2 samples 20; user turn 9; turn 3: 30 31
    first = turn([1, 2], [10, 11], "tool_calls")
    second = turn([1, 2, 10, 11, 7, 8], [20])
    third = turn([1, 2, 10, 11, 7, 8, 20, 9], [30, 31])
    [s] = build_sequences(trajectory(first, second, third))
    ids, mask, old = as_lists(s)
    assert ids == [1, 2, 10, 11, 7, 8, 20, 9, 30, 31]
    assert mask == [0, 0, 1, 1, 0, 0, 1, 0, 1, 1]
    assert old == pytest.approx([0, 0, -1.0, -1.1, 0, 0, -2.0, 0, -3.0, -3.1])


def test_a_turn_that_rewrites_history_starts_a_second_sequence_with_the_same_advantage():
    first = turn([1, 2], [10, 11])
    rewritten = turn([1, 2, 10, 99, 5], [20])  # the agent edited turn 1's answer
    sequences = build_sequences(trajectory(first, rewritten, advantage=0.25))
    assert [as_lists(s)[0] for s in sequences] == [[1, 2, 10, 11], [1, 2, 10, 99, 5, 20]]
    assert [as_lists(s)[1] for s in sequences] == [[0, 0, 1, 1], [0, 0, 0, 0, 0, 1]]
    assert [s.advantage for s in sequences] == [0.25, 0.25]


def test_an_interleaved_branch_does_not_break_the_main_sequence():
    main_1 = turn([1, 2], [10])
    side = turn([5, 6], [60])  # a sub-agent call in between
    main_2 = turn([1, 2, 10, 7], [20])
    main, branch = build_sequences(trajectory(main_1, side, main_2))
    assert as_lists(main)[:2] == ([1, 2, 10, 7, 20], [0, 0, 1, 0, 1])
    assert as_lists(branch)[:2] == ([5, 6, 60], [0, 0, 1])


def test_truncated_marks_only_the_sequence_whose_turn_hit_the_length_limit():
    cut, fine = build_sequences(trajectory(turn([1], [10], "length"), turn([2], [20])))
    assert (cut.truncated, fine.truncated) == (True, False)


def test_malformed_turns_are_rejected_with_their_position():
    with pytest.raises(ValueError, match="turn 1: 2 token_ids but 1 logprobs"):
        build_sequences(trajectory(turn([1], [10]), TurnRecord([2], [20, 21], [-1.0], "stop")))
    with pytest.raises(ValueError, match="empty prompt_token_ids"):
        build_sequences(trajectory(turn([], [10])))


def test_turns_from_record_reads_the_server_record_choice_by_choice():
    record = {
        "id": "chatcmpl-1",
        "prompt_token_ids": [1, 2],
        "choices": [
            {"index": 1, "token_ids": [7], "logprobs": [-0.7], "finish_reason": "length"},
            {"index": 0, "token_ids": [5, 6], "logprobs": [-0.5, -0.6], "finish_reason": "stop"},
        ],
    }
    assert turns_from_record(record) == [
        TurnRecord([1, 2], [5, 6], [-0.5, -0.6], "stop"),
        TurnRecord([1, 2], [7], [-0.7], "length"),
    ]


# --- pack_rows ----------------------------------------------------------------------------------


def test_pack_rows_right_pads_into_rows_by_longest():
    a, b = build_sequences(trajectory(turn([1, 2, 3], [40, 50]), turn([6], [70]), advantage=2.0))
    rows, dropped = pack_rows([a, b], max_length=8, mask_truncated=True)
    assert dropped == dict.fromkeys(DROP_REASONS, 0)
    assert rows.input_ids.tolist() == [[1, 2, 3, 40, 50], [6, 70, 0, 0, 0]]
    assert rows.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert rows.trained_mask.int().tolist() == [[0, 0, 0, 1, 1], [0, 1, 0, 0, 0]]
    torch.testing.assert_close(
        rows.old_logprobs, torch.tensor([[0, 0, 0, -4.0, -5.0], [0, -7.0, 0, 0, 0]])
    )
    assert rows.advantages.tolist() == [2.0, 2.0]
    assert rows.group_ids.tolist() == [3, 3]
    assert rows.trained_tokens == 3


def test_every_dropped_sequence_is_counted_under_one_reason():
    sequences = [
        sequence(4, name="kept"),
        sequence(9, name="too long"),
        sequence(3, trained=0, name="nothing sampled"),
        sequence(3, truncated=True, name="cut off"),
        sequence(9, truncated=True, name="cut off and too long"),  # counted once: truncated
    ]
    rows, dropped = pack_rows(sequences, max_length=8, mask_truncated=True)
    assert rows.trajectory_ids == ["kept"]
    assert dropped == {"no_trainable_tokens": 1, "truncated": 2, "over_length": 1}


def test_truncated_sequences_are_kept_when_not_masked():
    rows, dropped = pack_rows([sequence(3, truncated=True)], max_length=8, mask_truncated=False)
    assert rows.num_rows == 1
    assert dropped == dict.fromkeys(DROP_REASONS, 0)


def test_nothing_left_gives_empty_rows_and_full_counts():
    rows, dropped = pack_rows([sequence(3, trained=0)], max_length=8, mask_truncated=True)
    assert rows.input_ids.shape == (0, 0)
    assert rows.advantages.shape == (0,)
    assert dropped["no_trainable_tokens"] == 1


# --- micro_batches ------------------------------------------------------------------------------


def packed(lengths: list[int]) -> Rows:
    sequences = [sequence(n, trained=n - 1, name=f"r{i}") for i, n in enumerate(lengths)]
    rows, _ = pack_rows(sequences, max_length=100, mask_truncated=True)
    return rows


def test_micro_batches_stay_within_budget_and_cover_every_row_once():
    rows = packed([3, 9, 5, 5, 2, 12, 7])
    batches = micro_batches(rows, token_budget=15)
    for batch in batches:
        assert batch.input_ids.shape[1] == int(batch.lengths.max())  # trimmed to its longest
        assert batch.input_ids.numel() <= 15 or batch.num_rows == 1
    names = [name for batch in batches for name in batch.trajectory_ids]
    assert sorted(names) == sorted(rows.trajectory_ids)
    # longest first, equal lengths in original order
    assert names == ["r5", "r1", "r6", "r2", "r3", "r0", "r4"]
    assert [b.trajectory_ids for b in batches] == [["r5"], ["r1"], ["r6", "r2"], ["r3", "r0", "r4"]]


def test_a_row_longer_than_the_budget_is_a_micro_batch_of_its_own():
    batches = micro_batches(packed([20, 3, 3]), token_budget=10)
    assert [b.trajectory_ids for b in batches] == [["r0"], ["r1", "r2"]]


def test_micro_batches_are_deterministic():
    rows = packed([4, 4, 6, 2, 4, 6])
    first = micro_batches(rows, token_budget=12)
    second = micro_batches(rows, token_budget=12)
    assert [b.trajectory_ids for b in first] == [b.trajectory_ids for b in second]
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a.input_ids, b.input_ids)


def test_micro_batch_losses_with_the_step_denominator_add_up_to_the_full_loss():
    rows = packed([3, 9, 5, 5, 2])
    rows = dataclasses.replace(rows, advantages=torch.tensor([1.0, -1.0, 0.5, 2.0, -0.3]))
    torch.manual_seed(0)
    new_logprobs = rows.old_logprobs + 0.1 * torch.randn(rows.old_logprobs.shape)
    new_by_name = dict(zip(rows.trajectory_ids, new_logprobs, strict=True))
    for preset in ("grpo", "dr_grpo", "gspo", "cispo"):
        config = loss_preset(preset)
        full, _ = policy_loss(
            new_logprobs, rows.old_logprobs, rows.advantages, rows.trained_mask, config
        )
        denominator = loss_denominator(rows.trained_mask, config)
        total = torch.tensor(0.0)
        for batch in micro_batches(rows, token_budget=12):
            width = batch.input_ids.shape[1]
            batch_new = torch.stack([new_by_name[n][:width] for n in batch.trajectory_ids])
            loss, _ = policy_loss(
                batch_new,
                batch.old_logprobs,
                batch.advantages,
                batch.trained_mask,
                config,
                denominator=denominator,
            )
            total = total + loss
        torch.testing.assert_close(total, full)


# --- alignment ----------------------------------------------------------------------------------


def test_token_logprobs_align_with_input_ids_like_old_logprobs():
    # Position p's logprob is read from the logits at p - 1: the model's prediction of token p.
    vocab = 6
    input_ids = torch.tensor([[1, 4, 2, 5]])
    logits = torch.randn(1, 4, vocab)
    got = token_logprobs(logits, input_ids)
    expected = [0.0] + [
        torch.log_softmax(logits[0, p - 1], -1)[input_ids[0, p]].item() for p in range(1, 4)
    ]
    torch.testing.assert_close(got, torch.tensor([expected]))


def test_token_logprobs_of_a_window_match_the_full_forward():
    # The trainer computes logits only from the first trained column on (`logits_to_keep`):
    # the same function must give the same logprobs there, and zeros before.
    vocab, length, first = 7, 6, 3
    input_ids = torch.randint(0, vocab, (2, length))
    logits = torch.randn(2, length, vocab)
    full = token_logprobs(logits, input_ids)
    window = token_logprobs(logits[:, first - 1 :], input_ids, first_column=first)
    torch.testing.assert_close(window[:, first:], full[:, first:])
    assert window[:, :first].abs().sum() == 0
    _, entropy = token_logprobs_and_entropy(logits, input_ids)
    expected = -(torch.softmax(logits[0, 0], -1) * torch.log_softmax(logits[0, 0], -1)).sum()
    torch.testing.assert_close(entropy[0, 1], expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scored_positions_equal_log_softmax_and_its_gradient(dtype):
    # The chunked pass (no [positions, vocabulary] temporary) gives log_softmax's values bit for
    # bit (the sampler's), the entropy, and autograd's gradient, across chunk boundaries and
    # with a position scored for several labels (rows sharing a prefix).
    generator = torch.Generator().manual_seed(0)
    count, vocab = 2 * CHUNK_POSITIONS + 5, 300
    logits = (torch.randn(count, vocab, generator=generator) * 4).to(dtype).requires_grad_()
    positions = torch.cat([torch.arange(count), torch.tensor([3, 3, count - 1])])
    labels = torch.randint(0, vocab, positions.shape, generator=generator)
    upstream = torch.randn(positions.shape, generator=generator)
    chosen, entropy = scored_positions(logits, positions, labels)
    (chosen * upstream).sum().backward()
    got_grad, logits.grad = logits.grad, None
    reference = torch.log_softmax(logits.float(), dim=-1)
    assert torch.equal(chosen, reference[positions, labels])
    torch.testing.assert_close(entropy, -(reference.exp() * reference).sum(-1))
    assert not entropy.requires_grad
    (reference[positions, labels] * upstream).sum().backward()
    assert got_grad.dtype == dtype
    torch.testing.assert_close(
        got_grad, logits.grad, rtol=0, atol=1e-6 if dtype == torch.float32 else 1e-2
    )
    with pytest.raises(ValueError, match="positions for"):
        scored_positions(logits, positions[:-1], labels)


def test_token_logprobs_refuse_a_window_of_the_wrong_width():
    input_ids = torch.zeros(1, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="expected 3"):
        token_logprobs(torch.zeros(1, 4, 3), input_ids, first_column=3)
