"""The built-in dqn plugin in serial runs: it keeps its declared replay ratio (updates per env
step) and repeats for a seed; its policy, its double-DQN target and the spaces it refuses. That
it learns CartPole is the slow tier's (tests/slow/test_dqn.py)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import attrs
import gymnasium as gym
import numpy as np
import pytest
import torch

import mprl
from mprl.deprecated import MprlDeprecationWarning
from mprl.errors import UsageError
from mprl.host.job import resolve
from mprl.testing import SerialResult, plugin_manager, run_serial
from mprl.tools.cli import main
from mprl_builtin import dqn
from mprl_builtin.dqn import DQNConfig
from mprl_builtin.dqn.algorithm import _update, epsilon, make_model, replay_ratio
from tests.conftest import cli_here

#: a small network and SB3's default rhythm (an update every 4 env steps)
SMALL = {
    "hidden": [64, 64], "learning_starts": 500, "exploration_steps": 2000, "steps_per_update": 4,
    "gradient_steps": 1, "target_update": 100, "buffer_size": 10_000, "batch_size": 32,
    "lr": 1e-3,
}  # fmt: skip


@contextlib.contextmanager
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def dqn_serial(**kw) -> SerialResult:
    with one_torch_thread():
        return run_serial("dqn", plugins=[dqn], **kw)


def test_the_ratio_is_the_config_s_and_a_serial_run_repeats():
    dims = type("D", (), {"config": DQNConfig()})()
    assert replay_ratio(dims) == 128 * 64 / 256 == 32.0  # rl-zoo's CartPole: 32 rows per row
    config = {**SMALL, "n_step": 3, "envs_per_worker": 2, "gradient_steps": 2}
    a, b = (dqn_serial(total_steps=1500, workers=2, seed=3, config=config) for _ in "ab")
    assert a.episode_returns == b.episode_returns
    assert a.state.updates.value == b.state.updates.value > 0
    for name, tensor in a.model.state_dict().items():
        assert torch.equal(tensor, b.model.state_dict()[name]), name
    # 2 updates per 4 env steps (n-step rows trail the steps by up to 2 per env)
    rows = a.state.replay.added()
    assert a.summary.env_steps - 8 <= rows <= a.summary.env_steps
    assert abs(a.state.updates.value - (rows - 500) / 2) <= 2


def test_the_policy_is_greedy_when_deterministic_and_exploration_falls_linearly():
    torch.manual_seed(0)
    spaces = gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(3)
    model = make_model(*spaces, DQNConfig(hidden=(16,), exploration_final_eps=0.5))
    obs = torch.randn(400, 4)
    greedy = model.act(obs, True)
    assert isinstance(greedy, np.ndarray) and np.array_equal(greedy, model(obs).argmax(1).numpy())
    assert 0.2 < (model.act(obs, False) != greedy).mean() < 0.5  # half random, a third the same
    cfg = DQNConfig()
    assert epsilon(cfg, 999) == 1.0 and epsilon(cfg, 4000) == pytest.approx(0.52)
    assert epsilon(cfg, 8000) == epsilon(cfg, 10**7) == 0.04


def test_double_dqn_values_the_next_action_the_online_network_picks():
    spaces = gym.spaces.Box(-1, 1, (1,), np.float32), gym.spaces.Discrete(2)

    class Fixed(torch.nn.Module):
        def __init__(self, q: list[float]) -> None:
            super().__init__()
            self.q = torch.nn.Parameter(torch.tensor(q))

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return self.q.expand(obs.shape[0], 2)

    class Publish:
        def publishing(self, model):
            return contextlib.nullcontext()

    batch = {
        "obs": torch.zeros(1, 1), "action": torch.tensor([0]), "reward": torch.tensor([1.0]),
        "next_obs": torch.zeros(1, 1), "done": torch.tensor([0.0]),
        "discount": torch.tensor([0.5]),
    }  # fmt: skip
    for double, wanted in ((True, 1.0 + 0.5 * 3.0), (False, 1.0 + 0.5 * 5.0)):
        # the online network picks action 1 for the next observation, the target action 0
        online, target = Fixed([0.0, 2.0]), Fixed([5.0, 3.0])
        optimizer = torch.optim.SGD(online.parameters(), lr=0.1)
        cfg = DQNConfig(double=double)
        out = _update(cfg, online, target, optimizer, list(online.parameters()), batch, Publish())
        # the Huber loss of q(obs, 0) = 0 against the target: |wanted| - 0.5
        assert float(out["loss"]) == pytest.approx(wanted - 0.5)
        assert online.q.tolist()[0] == pytest.approx(0.1)  # one step up, clipped gradient 1
    assert make_model(*spaces, DQNConfig()).q[-1].out_features == 2


def test_continuous_actions_and_images_are_refused(capsys):
    code, err = cli_here(capsys, "run", "--plugin", "dqn", "--env", "Pendulum-v1")
    assert code == 2
    assert "'dqn' does not support the action space of 'Pendulum-v1' (Box)" in err
    code, err = cli_here(capsys, "run", "--plugin", "dqn", "--set", "n_step=0")
    assert code == 2 and "field 'n_step'" in err


def test_dqn_judges_solved_on_evaluation_episodes_unless_told_otherwise(capsys):
    """Its epsilon-greedy training returns lag a greedy policy that solves: by default a dqn
    run plays 10 evaluation episodes every 2,000 env steps and is judged on them."""
    pm = plugin_manager(dqn)
    _, _, _, run = resolve("dqn", pm, None, {"eval_every": None})  # a flag not given
    assert (run.eval_every, run.eval_episodes) == (2000, 10)
    _, _, _, run = resolve("dqn", pm, None, {"eval_every": 0, "eval_episodes": 3})
    assert (run.eval_every, run.eval_episodes) == (0, 3)  # the user's values win, 0 too
    assert main(["run", "--plugin", "dqn", "--help"]) == 0
    assert "its run options unless given: --eval-every 2000\n" in capsys.readouterr().out
    odd = attrs.evolve(dqn.ALGORITHM, name="odd", run_defaults={"eval_evry": 5})
    with pytest.raises(
        UsageError, match="algorithm 'odd''s run_defaults: unknown field 'eval_evry'"
    ):
        resolve("odd", plugin_manager(_Registers(odd)), None, {})


class _Registers:
    def __init__(self, algorithm):
        self.algorithm = algorithm

    @mprl.hookimpl
    def mprl_register_algorithms(self, register):
        register(self.algorithm)


# -- train_freq, the old name of steps_per_update (sac's name for the same setting) ------------

RENAMED = (
    "dqn config: field 'train_freq' is deprecated: use 'steps_per_update' instead (the same "
    "setting); 'train_freq' goes away in mprl 0.3.0"
)


@pytest.mark.parametrize("where", ["--set", "toml"])
def test_the_old_name_train_freq_still_sets_steps_per_update_with_a_warning(
    where, tmp_path, capsys
):
    given = ["--set", "train_freq=8"]
    if where == "toml":
        (tmp_path / "exp.toml").write_text("train_freq = 8\n")
        given = ["--config", str(tmp_path / "exp.toml")]
    run_dir = tmp_path / "run"
    with one_torch_thread():
        code, err = cli_here(
            capsys, "run", "--plugin", "dqn", *given, "--set", "buffer_size=1000", "--serial",
            "--workers", "1", "--total-steps", "50", "--quiet", "--run-dir", str(run_dir),
        )  # fmt: skip
    assert (code, err) == (0, f"mprl: warning: {RENAMED}\n")  # one line, before it ran
    config = json.loads((run_dir / "config.json").read_text())["config"]
    assert config["steps_per_update"] == 8 and "train_freq" not in config


def _as_before_the_rename(run_dir: Path) -> None:
    """Make ``run_dir`` what a run made before the rename left: ``train_freq`` in its config."""
    for path in run_dir.glob("checkpoints/*.pt"):
        data = torch.load(path, weights_only=True)
        data["config"]["train_freq"] = data["config"].pop("steps_per_update")
        torch.save(data, path)
    saved = json.loads((run_dir / "config.json").read_text())
    saved["config"]["train_freq"] = saved["config"].pop("steps_per_update")
    (run_dir / "config.json").write_text(json.dumps(saved))


def test_a_run_made_before_the_rename_loads_and_resumes(tmp_path):
    run_dir = tmp_path / "run"
    config = {**SMALL, "steps_per_update": 8, "learning_starts": 100}
    first = dqn_serial(total_steps=300, workers=1, run_dir=run_dir, config=config)
    assert first.summary.status == "finished"
    _as_before_the_rename(run_dir)
    pm = plugin_manager(dqn)
    with pytest.warns(MprlDeprecationWarning) as caught:
        loaded = mprl.load(run_dir, plugins=pm)
    assert [str(w.message) for w in caught] == [RENAMED]
    assert loaded.config.steps_per_update == 8 and loaded.data["config"]["train_freq"] == 8
    renamed = pytest.warns(MprlDeprecationWarning, match="field 'train_freq' is deprecated")
    with renamed, one_torch_thread():
        summary = mprl.run(
            resume=run_dir, plugins=pm, backend="serial", total_steps=600, progress="none"
        )
    assert summary.status == "finished" and summary.session == 1 and summary.env_steps >= 600
    resumed = json.loads((run_dir / "config.json").read_text())["config"]
    assert resumed["steps_per_update"] == 8 and "train_freq" not in resumed  # written anew
    with pytest.warns(MprlDeprecationWarning):  # given both, the later one counts
        both = mprl.run(
            resume=run_dir, plugins=pm, backend="serial", total_steps=700, progress="none",
            config={"train_freq": 16},
        )  # fmt: skip
    assert json.loads((run_dir / "config.json").read_text())["config"]["steps_per_update"] == 16
    assert both.status == "finished"
