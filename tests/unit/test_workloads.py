"""Beyond CartPole: image observations (CNN torsos, uint8 frames end to end), Atari with its
standard preprocessing, MuJoCo with observation normalisation, workload presets, and the train
process's device (``--device``)."""

from __future__ import annotations

import importlib.util
import re
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from mprl.backends.child import DeviceLearner
from mprl.device import Staging
from mprl.environments import workload
from mprl.environments.atari import make_atari
from mprl.errors import ConfigError
from mprl.host.job import resolve
from mprl.host.plugins import get_plugin_manager
from mprl.lib.envbatch import EnvBatch, rollout_spec
from mprl.lib.nets import ActorCritic, ActorCriticConfig, ObsNorm, make_model, make_optimizer
from mprl.testing import run_serial
from tests.conftest import cli_here

#: only the tests that need an extra skip without it (the GPU and normalisation tests run anyway)
needs_atari = pytest.mark.skipif(
    importlib.util.find_spec("ale_py") is None, reason='needs ale-py: pip install "mprl[atari]"'
)
FRAMES = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)


@pytest.mark.parametrize(
    ("shape", "torso", "kind"),
    [((4, 84, 84), "auto", "nature"), ((84, 84, 3), "auto", "nature"), ((4, 84, 84), "impala", "impala"), ((64, 64, 3), "impala", "impala")],
)  # fmt: skip
def test_image_observations_get_a_cnn_that_takes_uint8_frames(shape, torso, kind):
    space = gym.spaces.Box(0, 255, shape, np.uint8)
    model = ActorCritic(space, gym.spaces.Discrete(6), (64,), torso)
    assert model.torso_kind == kind
    frames = torch.randint(0, 256, (5, *shape), dtype=torch.uint8)
    out, value = model(frames)
    assert out.shape == (5, 6) and value.shape == (5,)
    # the policy alone, and the value alone, are the two sides of the same forward
    assert torch.allclose(model.policy(frames), out) and torch.allclose(model.value(frames), value)
    actions = model.act(frames, deterministic=True)
    assert isinstance(actions, np.ndarray) and actions.shape == (5,)
    # frames scaled by the network: a brighter frame is a different input, not clipped to 1
    assert not torch.allclose(model.policy(frames // 2), out)


def test_a_rollout_slot_of_frames_is_a_quarter_of_float32():
    spec = rollout_spec(FRAMES, gym.spaces.Discrete(6), steps=16, envs=8)
    shape, dtype = spec["obs"]
    assert dtype == torch.uint8 and shape == (17, 8, 4, 84, 84)
    flat = rollout_spec(gym.spaces.Box(-1, 1, (4, 84, 84)), gym.spaces.Discrete(6), 16, 8)
    nbytes = {k: torch.empty(s, dtype=d).nbytes for k, (s, d) in spec.items()}
    float_bytes = {k: torch.empty(s, dtype=d).nbytes for k, (s, d) in flat.items()}
    assert nbytes["obs"] * 4 == float_bytes["obs"]


@pytest.mark.parametrize(
    ("space", "torso", "message"),
    [
        (FRAMES, "mlp", r"config field 'torso': the observations are images \(4, 84, 84\) uint8, which an MLP cannot learn from; use --set torso=nature"),
        (gym.spaces.Box(-1, 1, (8,)), "nature", r"config field 'torso': 'nature' needs image observations .*; use --set torso=mlp"),
    ],
)  # fmt: skip
def test_a_torso_that_cannot_work_is_refused_with_the_one_that_does(space, torso, message):
    with pytest.raises(ConfigError, match=message):
        make_model(space, gym.spaces.Discrete(2), ActorCriticConfig(torso=torso))


class _Worker:
    """The part of a Context EnvBatch uses, over real Atari games (or envs ``make`` builds)."""

    def __init__(self, env_id: str, make=make_atari) -> None:
        self.env_id, self.make, self.episodes, self.steps = env_id, make, [], 0

    def batch(self, way: str, n: int) -> EnvBatch:
        if way == "gym":
            return EnvBatch(self, n, 0.99)
        pytest.importorskip("envpool")
        from mprl.lib.envpool import make_pool

        return EnvBatch(self, n, 0.99, pool=make_pool(self.env_id, list(range(n))))

    def make_env(self, index: int) -> gym.Env:
        env = self.make(self.env_id)
        env.reset(seed=index)
        env.action_space.seed(index)
        return env

    def log_episode(self, episode_return: float, episode_length: int) -> None:
        self.episodes.append((episode_return, episode_length))

    def add_steps(self, n: int) -> None:
        self.steps += n


@needs_atari
def test_workload_presets_apply_under_the_users_own_values():
    pm = get_plugin_manager()
    assert workload("ALE/Pong-v5") == "atari" and workload("PongNoFrameskip-v4") == "atari"
    assert workload("HalfCheetah-v5") == "mujoco" and workload("CartPole-v1") is None
    _, _, config, _ = resolve("ppo", pm, {"n_steps": 64}, {"env": "ALE/Pong-v5"})
    assert (config.n_steps, config.lr, config.clip, config.epochs) == (64, 2.5e-4, 0.1, 4)
    _, _, config, _ = resolve("ppo", pm, None, {"env": "HalfCheetah-v5"})
    assert config.normalize_obs and config.n_steps == 1024
    _, _, config, _ = resolve("ppo", pm, None, {"env": "CartPole-v1"})
    assert config.n_steps == 32 and not config.normalize_obs  # unchanged


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--plugin", "ppo", "--env", "ALE/Pong-v5", "--set", "torso=mlp"], r"config field 'torso': the observations are images \(4, 84, 84\) uint8, which an MLP cannot learn from; use --set torso=nature", marks=needs_atari),
        (["--plugin", "a3c", "--device", "cuda"], r"--device cuda: algorithm 'a3c' trains one shared model in every worker \(Hogwild, CPU shared memory\), so it cannot learn on a GPU; use --device cpu"),
        (["--plugin", "ppo", "--device", "gpu"], r"run option 'device': 'gpu' is not one of auto, cpu, cuda, cuda:N"),
    ],
)  # fmt: skip
def test_bad_workload_input_exits_2_with_the_line_that_fixes_it(tmp_path, capsys, args, message):
    code, err = cli_here(capsys, "run", *args, "--run-dir", str(tmp_path / "run"))
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and re.search(message, err), err
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is there")
def test_a_gpu_asked_for_where_there_is_none_exits_2(tmp_path, capsys):
    code, err = cli_here(
        capsys, "run", "--plugin", "ppo", "--device", "cuda:0", "--run-dir", str(tmp_path / "r")
    )
    assert code == 2 and "use --device cpu (or auto)" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "HalfCheetah-v5"], r"--env-batch envpool: mprl steps classic-control and Atari envs with EnvPool, not 'HalfCheetah-v5' .*; use --env-batch gym"),
        (["--env", "CartPole-v1", "--env-batch", "pool"], r"field 'env_batch': 'env_batch' must be in \('gym', 'envpool'\)"),
    ],
)  # fmt: skip
def test_envpool_where_it_cannot_work_exits_2(tmp_path, capsys, args, message):
    pytest.importorskip("envpool")
    args = ["--env-batch", "envpool", *args] if "--env-batch" not in args else args
    code, err = cli_here(capsys, "run", "--plugin", "ppo", *args, "--run-dir", str(tmp_path / "r"))
    assert code == 2 and re.search(message, err), err


def test_envpool_missing_names_the_install_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)
    code, err = cli_here(
        capsys, "run", "--plugin", "ppo", "--env-batch", "envpool", "--run-dir", str(tmp_path / "r")
    )
    assert code == 2 and 'EnvPool is not installed: pip install "mprl[envpool]"' in err, err


def test_missing_extras_name_the_install_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ale_py", None)  # importing it fails, as when not installed
    code, err = cli_here(
        capsys, "run", "--plugin", "ppo", "--env", "ALE/Pong-v5", "--run-dir", str(tmp_path / "a")
    )
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert 'is an Atari game, and ale_py is not installed: pip install "mprl[atari]"' in err, err
    monkeypatch.setitem(sys.modules, "mujoco", None)
    for name in [m for m in sys.modules if m.startswith("gymnasium.envs.mujoco")]:
        monkeypatch.delitem(sys.modules, name)
    code, err = cli_here(
        capsys,
        "run",
        "--plugin",
        "ppo",
        "--env",
        "HalfCheetah-v5",
        "--run-dir",
        str(tmp_path / "m"),
    )
    assert code == 2 and 'runs on MuJoCo: pip install "mprl[mujoco]"' in err, err
    assert len(err.strip().splitlines()) == 1


def test_obs_norm_statistics_equal_those_of_everything_it_saw():
    norm = ObsNorm((3,))
    x = torch.randn(10, 3)
    assert torch.equal(norm(x), x)  # nothing seen yet: the identity
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randn(n, 3, generator=gen) * 4 + 7 for n in (5, 17, 1, 40)]
    for batch in batches:
        norm.update(batch)
    everything = torch.cat(batches).double()
    assert int(norm.count) == 63
    assert torch.allclose(norm.mean, everything.mean(0))
    assert torch.allclose(norm.var, everything.var(0, unbiased=False))
    out = norm(everything.float())
    assert torch.allclose(out.mean(0), torch.zeros(3), atol=1e-5)


def test_reward_normalisation_divides_by_the_std_of_the_discounted_return_so_far():
    """Pendulum pays -16 to 0 a step: what a worker writes for learning is the reward over the
    standard deviation of every discounted return seen so far, clipped to 10 (VecNormalize's
    ``norm_reward``),
    the time-limit bootstrap added after scaling, while the logged returns stay the env's."""
    env = gym.make("Pendulum-v1")
    steps, n, gamma, value = 500, 2, 0.99, 3.0
    torch.manual_seed(0)
    model = ActorCritic(env.observation_space, env.action_space, (8,))
    with torch.no_grad():  # V(x) = value everywhere: the bootstrap is known
        model.v[-1].weight.zero_()
        model.v[-1].bias.fill_(value)
    spec = rollout_spec(env.observation_space, env.action_space, steps, n)
    slots, logged = [], []
    for scaled in (False, True):
        worker = _Worker("Pendulum-v1", make=gym.make)
        envs = EnvBatch(worker, n, gamma, normalize_reward=scaled)
        slot = {name: torch.zeros(shape, dtype=dtype) for name, (shape, dtype) in spec.items()}
        torch.manual_seed(1)  # the same actions both times
        envs.rollout(model, slot)
        envs.close()
        slots.append(slot)
        logged.append(worker.episodes)
    plain, normed = slots
    assert torch.equal(plain["obs"], normed["obs"]) and torch.equal(plain["done"], normed["done"])
    assert logged[0] == logged[1] and len(logged[0]) == 4  # 200-step episodes, raw returns
    assert all(-2000 < r < -100 for r, _ in logged[0])
    done = plain["done"].bool().numpy()
    raw = plain["reward"].double().numpy() - done * gamma * value  # the env's own rewards
    ret, seen, expected = np.zeros(n), [], np.zeros_like(raw)
    for t in range(steps):
        ret = ret * gamma + raw[t]
        seen.extend(ret)
        expected[t] = np.clip(raw[t] / np.std(seen), -10, 10) + done[t] * gamma * value
        ret[done[t]] = 0.0
    assert np.allclose(normed["reward"].numpy(), expected, rtol=1e-3, atol=1e-4)
    assert np.std(seen) > 50  # the raw returns: far from unit scale


def test_a_device_learner_trains_copies_and_syncs_the_optimizer_state_back():
    """The GPU learner's code path, on the CPU: copies of the shared model and optimizer,
    trained there; the state copied back on sync, so a checkpoint holds it."""
    space, actions = gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2)
    shared = ActorCritic(space, actions, (16,))
    opt = make_optimizer(shared.parameters(), ActorCriticConfig(lr=0.01))
    before = [p.detach().clone() for p in shared.parameters()]
    learner = DeviceLearner(shared, {"": opt}, torch.device("cpu"))
    mine = learner.optimizers[""]
    assert type(mine) is type(opt) and mine.defaults == opt.defaults
    assert all(
        p.data_ptr() != q.data_ptr()
        for p, q in zip(learner.model.parameters(), shared.parameters(), strict=True)
    )
    for step in range(3):
        out, value = learner.model(torch.randn(8, 4, generator=torch.Generator().manual_seed(step)))
        mine.zero_grad()
        (out.pow(2).sum() + value.pow(2).sum()).backward()
        mine.step()
    mine.param_groups[0]["lr"] = 0.005
    assert all(torch.equal(p, b) for p, b in zip(shared.parameters(), before, strict=True))
    assert not opt.state  # nothing reached the shared optimizer yet
    learner.sync()
    assert opt.param_groups[0]["lr"] == 0.005
    for p, q in zip(learner.model.parameters(), shared.parameters(), strict=True):
        assert int(opt.state[q]["step"]) == 3
        assert torch.equal(opt.state[q]["exp_avg"], mine.state[p]["exp_avg"])


def test_staging_moves_a_batch_in_one_buffer_and_gives_the_same_tensors():
    gen = torch.Generator().manual_seed(0)
    batch = {
        "obs": torch.randint(0, 256, (9, 2, 4, 84, 84), dtype=torch.uint8, generator=gen),
        "action": torch.randint(0, 6, (8, 2), generator=gen),
        "logp": torch.randn(2, 8, generator=gen).t(),  # not contiguous
        "version": torch.tensor([3, 4]),
    }
    staging = Staging(torch.device("cpu"), pack=True)
    for _ in range(2):  # the buffer is reused
        out = staging(batch)
        assert all(torch.equal(out[k], batch[k]) and out[k].dtype == batch[k].dtype for k in batch)
        assert all(
            out[k].untyped_storage().data_ptr() == staging.buffer.untyped_storage().data_ptr()
            for k in batch
        )
    assert Staging(torch.device("cpu"))(batch)["obs"] is batch["obs"]  # on the CPU: as it is


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("algorithm", ["impala", "ppo"])
def test_a_gpu_learner_learns_cartpole_and_checkpoints_its_optimizer(algorithm, tmp_path):
    result = run_serial(algorithm, total_steps=20_000, device="cuda", run_dir=tmp_path / "run")
    assert result.summary.env_steps >= 20_000
    assert all(p.device.type == "cpu" for p in result.model.parameters())
    saved = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=False)
    state = next(iter(saved["optimizer"]["state"].values()))
    assert int(state["step"]) > 0 and float(state["exp_avg"].abs().sum()) > 0
