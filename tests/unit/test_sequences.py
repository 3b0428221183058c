"""mprl.lib.sequences: the learners' batched replay of stored sequences (one nn.GRU / nn.LSTM
call over the episode pieces) against the workers' step-by-step cells, episode ends inside the
sequences included; and the chunks of MAPPO's recurrent training, padded and masked."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from mprl.lib.recurrent import RecurrentActorCritic
from mprl.lib.sequences import Segments, chunk, chunk_starts


def _dones(length: int, n: int) -> torch.Tensor:
    """Episode ends at chosen places: none in sequence 0, two in a row in 1, one after the
    first step in 2, one before the last in 3, the rest at random."""
    torch.manual_seed(3)
    dones = (torch.rand(length, n) < 0.15).float()
    dones[:, 0] = 0.0
    dones[:, 1] = 0.0
    dones[[4, 5], 1] = 1.0
    dones[0, 2] = 1.0
    dones[length - 2, 3] = 1.0
    return dones


@pytest.mark.parametrize("core", ["gru", "lstm"])
def test_the_batched_replay_is_the_step_by_step_one_with_episode_ends_inside(core):
    torch.manual_seed(0)
    model = RecurrentActorCritic(
        gym.spaces.Box(-1, 1, (5,)), gym.spaces.Discrete(3), (16,), core, 8
    )
    length, n = 12, 7
    obs, state = torch.randn(length, n, 5), torch.randn(model.state_rows, n, 8)
    dones = _dones(length, n)
    assert dones[: length - 1].sum() > 3  # episode ends inside the sequences
    batched = model.unroll(obs, state, dones)
    stepwise = model.unroll_stepwise(obs, state, dones)
    for now, then in zip(batched, stepwise, strict=True):  # outputs, values, last states
        torch.testing.assert_close(now, then, rtol=0, atol=1e-5)
    actions = torch.randint(0, 3, (length, n))
    logp = model.log_prob_entropy(batched[0], actions)[0]
    torch.testing.assert_close(
        logp, model.log_prob_entropy(stepwise[0], actions)[0], atol=1e-5, rtol=0
    )


@pytest.mark.parametrize("core", ["gru", "lstm"])
def test_the_batched_replay_has_the_step_by_step_gradients(core):
    torch.manual_seed(1)
    model = RecurrentActorCritic(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2), (8,), core, 6)
    obs, state, dones = torch.randn(9, 5, 3), torch.randn(model.state_rows, 5, 6), _dones(9, 5)
    grads = []
    for unroll in (model.unroll, model.unroll_stepwise):
        model.zero_grad()
        out, values, _ = unroll(obs, state, dones)
        (out.square().sum() + values.sum()).backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    for now, then in zip(*grads, strict=True):
        torch.testing.assert_close(now, then, rtol=1e-4, atol=1e-5)


def test_segments_cut_the_sequences_at_the_episode_ends():
    dones = torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])  # [L - 1 = 4, 2]
    pieces = Segments(dones, 5, 2)
    assert pieces.pieces == 4  # sequence 0: steps 0-2, 3-4; sequence 1: step 0, steps 1-4
    assert pieces.lengths.tolist() == [3, 2, 1, 4]
    assert pieces.heads.tolist() == [0, 2] and pieces.tails.tolist() == [1, 3]
    assert Segments(torch.zeros(4, 3), 5, 3).pieces == 3  # none inside: as they are


def test_chunks_are_columns_of_each_rollout_the_last_padded_with_zeros():
    x = torch.arange(2 * 7, dtype=torch.float32).view(7, 2)  # [T = 7, N = 2]: x[t, j] = 2t + j
    chunks = chunk(x, 3)
    assert chunk_starts(7, 3) == [0, 3, 6]
    assert chunks.shape == (3, 6)  # 3 chunks of each rollout: column c * N + j
    assert chunks[:, 0].tolist() == [0.0, 2.0, 4.0]  # rollout 0, steps 0-2
    assert chunks[:, 3].tolist() == [7.0, 9.0, 11.0]  # rollout 1, steps 3-5
    assert chunks[:, 5].tolist() == [13.0, 0.0, 0.0]  # rollout 1, step 6, then padding
    valid = chunk(torch.ones(7, 2), 3)
    assert valid.sum() == 14 and valid[1:, 4:].sum() == 0
    assert chunk(torch.zeros(6, 2, 4, 5), 3).shape == (3, 4, 4, 5)
