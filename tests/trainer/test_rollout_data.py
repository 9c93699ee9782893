import json

import pytest
import torch

from trainer.rollout_data import (RolloutDataError, group_rollouts, pad_batch, read_rollouts,
                                  step_group_order)


def row(task="t1", idx=0, reward=1.0, status="ok", prompt=(3, 5, 7), tokens=(9, 4), logprobs=(-0.5, -0.1)):
    return {"task_id": task, "sample_idx": idx, "prompt_token_ids": list(prompt), "token_ids": list(tokens),
            "logprobs": list(logprobs), "reward": reward, "status": status}


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("bad, message", [
    ({"reward": None}, r"missing column\(s\) \['reward'\]"),
    ({"logprobs": [-0.1]}, "1 logprobs for 2 completion tokens"),
    ({"token_ids": []}, "token_ids must be a non-empty list"),
    ({"reward": float("nan")}, "reward must be a finite number"),
    ({"logprobs": [0.3, -1.0]}, "logprobs must be numbers <= 0"),
])
def test_malformed_rows_are_named(tmp_path, bad, message):
    path = write(tmp_path / "r.jsonl", [row(), {**row(idx=1), **bad}])
    with pytest.raises(RolloutDataError, match=f"row 1: {message}"):
        read_rollouts(path)


def test_unreadable_or_missing_file(tmp_path):
    with pytest.raises(RolloutDataError, match="does not exist"):
        read_rollouts(tmp_path / "nope.jsonl")
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(RolloutDataError, match="cannot be parsed"):
        read_rollouts(tmp_path / "bad.jsonl")


def test_parquet_and_jsonl_read_alike(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [row(), row(idx=1, reward=0.0)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "r.parquet")
    assert read_rollouts(tmp_path / "r.parquet") == read_rollouts(write(tmp_path / "r.jsonl", rows))


def test_grouping_drops_flat_groups_and_masks_infra_failures():
    rows = [row("a", 0, 1.0), row("a", 1, 0.0), row("a", 2, 1.0, "timeout"),
            row("b", 0, 1.0), row("b", 1, 1.0),
            row("c", 0, 0.0), row("c", 1, 0.0, "sandbox_error")]
    groups = group_rollouts(rows, scale_by_std=False)
    assert (groups.groups_kept, groups.groups_dropped) == (1, 2)
    assert [r["sample_idx"] for r in groups.rows] == [0, 1, 2]
    assert groups.advantages.tolist() == [0.5, -0.5, 0.0]
    assert groups.valid.tolist() == [True, True, False]
    assert groups.with_signal == 1


def test_without_dynamic_sampling_flat_groups_stay_with_zero_advantage():
    rows = [row("a", 0, 1.0), row("a", 1, 0.0), row("b", 0, 1.0), row("b", 1, 1.0), row("c", 0, 0.0),
            row("c", 1, 0.0)]
    groups = group_rollouts(rows, scale_by_std=False, drop_uniform=False)
    assert (groups.groups_kept, groups.groups_dropped, groups.with_signal) == (3, 0, 1)
    assert groups.advantages.tolist() == [0.5, -0.5, 0.0, 0.0, 0.0, 0.0]
    assert group_rollouts(rows[2:], scale_by_std=False, drop_uniform=False).with_signal == 0


def test_group_with_mixed_prompts_is_rejected():
    with pytest.raises(RolloutDataError, match="different prompts"):
        group_rollouts([row(reward=1.0), row(idx=1, reward=0.0, prompt=(3, 5, 8))], scale_by_std=False)


def test_step_order_is_a_function_of_step_and_seed():
    steps = [step_group_order(5, 2, s, seed=7) for s in range(5)]
    flat = [g for s in steps for g in s]
    assert sorted(flat[:5]) == list(range(5)) and sorted(flat[5:10]) == list(range(5))  # epochs
    assert steps[3] == step_group_order(5, 2, 3, seed=7)  # no hidden state: resumable
    assert steps != [step_group_order(5, 2, s, seed=8) for s in range(5)]
    assert len(step_group_order(3, 7, 0, seed=0)) == 7  # more groups per step than exist


def test_pad_batch_aligns_targets_with_completion():
    batch = pad_batch([row(prompt=(3, 5, 7), tokens=(9, 4), logprobs=(-0.5, -0.1)),
                       row(prompt=(3,), tokens=(8,), logprobs=(-2.0,))], pad_id=0)
    assert batch["input_ids"].tolist() == [[3, 5, 7, 9, 4], [3, 8, 0, 0, 0]]
    # target position t is the token at t+1: completion tokens of row 0 sit at t = 2, 3
    assert batch["mask"].tolist() == [[False, False, True, True], [True, False, False, False]]
    assert batch["input_ids"][:, 1:][batch["mask"]].tolist() == [9, 4, 8]
    assert torch.allclose(batch["behaviour_logp"][batch["mask"]], torch.tensor([-0.5, -0.1, -2.0]))
