"""``mprl export`` of real runs, one per built-in plugin (recurrent cores and several agents
included): each exported file, TorchScript and ONNX, played on observations recorded from the
env, episode ends and all, gives the actions of ``mprl.load(run).act(obs, deterministic=True)``;
and the files exported by ``python -m mprl export`` play in a Python where mprl cannot be
imported."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mprl
from mprl.host.envs import make_env
from mprl.host.plugins import get_plugin_manager
from mprl.testing import run_serial
from mprl_builtin.export import export_run
from mprl_builtin.export.formats import runner
from tests.conftest import cli, own_group

pytest.importorskip("onnxruntime")

MPE = "mpe2:simple_spread_v3(N=2, max_cycles=12"
#: a real short run of each built-in plugin: (algorithm, env, config, total steps)
RUNS = {
    "a3c": ("a3c", "CartPole-v1", {"envs_per_worker": 2}, 200),
    "ppo": ("ppo", "CartPole-v1", {"envs_per_worker": 2, "n_steps": 32}, 128),
    "ppo-lstm": ("ppo", "CartPole-v1",
                 {"envs_per_worker": 2, "n_steps": 32, "core": "lstm", "minibatch_size": 64}, 128),
    "impala-gru": ("impala", "CartPole-v1", {"core": "gru"}, 200),
    "dqn": ("dqn", "CartPole-v1", {"learning_starts": 50}, 200),
    "sac": ("sac", "Pendulum-v1",
            {"hidden": [16, 16], "batch_size": 16, "learning_starts": 50, "buffer_size": 400}, 150),
    "mappo": ("mappo", f"{MPE})", {"envs_per_worker": 2, "n_steps": 12, "epochs": 1}, 96),
    "qmix": ("qmix", f"{MPE})",
             {"hidden": [16], "batch_size": 8, "learning_starts": 24, "buffer_size": 400}, 96),
    "rmappo-gru-box": ("ippo", f"{MPE}, continuous_actions=True)",
                       {"envs_per_worker": 2, "n_steps": 12, "epochs": 1, "core": "gru",
                        "data_chunk_length": 6, "share_params": False}, 96),
}  # fmt: skip
#: envs played side by side, and steps, to record observations
ENVS, STEPS = 3, 30


class Runs(dict):
    """Each plugin's run directory (a serial run), made when a test first asks for it."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, name: str) -> Path:
        algorithm, env, config, steps = RUNS[name]
        run_dir = self.root / name
        run_serial(algorithm, env=env, config=config, total_steps=steps, workers=1,
                   run_dir=run_dir, seed=1)  # fmt: skip
        self[name] = run_dir
        return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("runs"))


def record(ckpt: mprl.Checkpoint, envs: int = ENVS, steps: int = STEPS) -> dict[str, np.ndarray]:
    """Play the checkpoint's policy (``act(obs, deterministic=True)``) in ``envs`` of its env:
    the observations of each step ``[steps, envs, ...]``, where an episode began ``[steps,
    envs]`` (a recurrent policy's state is zeroed there) and the actions ``act`` chose."""
    pm = get_plugin_manager()
    games = [make_env(pm, ckpt.run.env, seed=i) for i in range(envs)]
    try:
        obs = [game.reset(seed=10 + i)[0] for i, game in enumerate(games)]
        began = np.ones(envs, bool)
        seen: dict[str, list[Any]] = {"obs": [], "began": [], "action": []}
        for t in range(steps):
            batch = np.stack(obs).astype(np.float32)  # (as the env room gives them: no frames)
            actions = np.asarray(ckpt.act(batch, deterministic=True))
            for key, value in (("obs", batch), ("began", began), ("action", actions)):
                seen[key].append(value)
            began = np.zeros(envs, bool)
            for i, game in enumerate(games):
                obs[i], _, terminated, truncated, _ = game.step(actions[i])
                if terminated or truncated or (t, i) == (steps // 3, 1):  # (one cut short)
                    obs[i], _ = game.reset()
                    began[i] = True
                    if hasattr(ckpt.model, "begin_episode"):
                        ckpt.model.begin_episode(i)
        return {key: np.stack(values) for key, values in seen.items()}
    finally:
        for game in games:
            game.close()


def replay(run: Any, recorded: dict[str, np.ndarray], state_shapes: dict) -> np.ndarray:
    """The exported policy's actions on the recorded observations, its state zeroed where an
    episode began (what a player does)."""
    envs = recorded["obs"].shape[1]
    state = [np.zeros((envs, *shape), np.float32) for shape in state_shapes.values()]
    actions = []
    for obs, began in zip(recorded["obs"], recorded["began"], strict=True):
        for s in state:
            s[began] = 0.0
        action, *state = run(obs, *state)
        actions.append(np.asarray(action))
    return np.stack(actions)


def same_actions(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape
    if expected.dtype.kind in "iu":
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, expected)
    else:
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
@pytest.mark.parametrize("name", RUNS)
def test_an_exported_policy_acts_as_the_run_does_on_recorded_observations(runs, name, fmt):
    run_dir = runs[name]
    done = export_run(run_dir, run_dir / f"{fmt}.policy", fmt=fmt)
    assert done.checked.startswith("the same actions as act(obs, deterministic=True)")
    recorded = record(mprl.load(run_dir))
    assert recorded["began"][1:].any()  # new episodes: a recurrent policy's state zeroed
    play = runner(fmt, done.path)
    same_actions(replay(play, recorded, done.state_shapes), recorded["action"])


#: what plays exported files where mprl is not: the venv's packages without its .pth files (no
#: editable finder), mprl and mprl_builtin blocked; each file on observations from an .npz file
PLAYER = r"""
import sys
for name in ("mprl", "mprl_builtin"):
    sys.modules[name] = None  # import mprl raises ImportError
sys.path.append(sys.argv[1])
import json

import numpy as np


def load_torchscript(path):
    import torch

    extra = {"mprl.json": ""}  # what the file says of itself: the state's shapes
    policy = torch.jit.load(path, _extra_files=extra)

    def run(*inputs):
        out = policy(*(torch.from_numpy(x) for x in inputs))
        return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]

    return run, list(json.loads(extra["mprl.json"])["state"].values())


def load_onnx(path):
    import onnxruntime

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def run(*inputs):
        return session.run(None, dict(zip(names, inputs)))

    return run, [i.shape[1:] for i in session.get_inputs()[1:]]


jobs = sys.argv[2:]
for fmt, path, data, out in zip(jobs[::4], jobs[1::4], jobs[2::4], jobs[3::4]):
    run, shapes = (load_torchscript if fmt == "torchscript" else load_onnx)(path)
    recorded = np.load(data)
    envs = recorded["obs"].shape[1]
    state = [np.zeros((envs, *shape), np.float32) for shape in shapes]
    actions = []
    for obs, began in zip(recorded["obs"], recorded["began"]):
        for s in state:
            s[began] = 0.0  # a new episode: its state starts at zeros
        action, *state = run(obs, *state)
        actions.append(action)
    np.save(out, np.stack(actions))
    print(fmt, "played", len(actions), "steps of", envs, "envs without mprl")
assert "mprl" not in {m.split(".")[0] for m, v in sys.modules.items() if v is not None}
"""


def test_policies_exported_by_the_command_play_where_mprl_cannot_be_imported(runs, tmp_path):
    jobs = []
    for name, fmt, out in (
        ("ppo-lstm", "torchscript", "ppo.pt"),
        ("rmappo-gru-box", None, "ma.onnx"),
    ):
        run_dir = runs[name]
        recorded = record(mprl.load(run_dir))
        np.savez(tmp_path / f"{name}.npz", **recorded)
        proc = cli("export", str(run_dir), "-o", str(tmp_path / out),
                   *(["--format", fmt] if fmt else []))  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"mprl: wrote {tmp_path / out} (")
        assert "  inputs:  obs " in proc.stdout and "next_h" in proc.stdout
        jobs.append((name, fmt or "onnx", tmp_path / out, recorded))
    site = sysconfig.get_paths()["purelib"]
    args = [str(a) for n, f, o, _ in jobs for a in (f, o, tmp_path / f"{n}.npz", tmp_path / n)]
    played = subprocess.run(
        [sys.executable, "-I", "-S", "-c", PLAYER, site, *args],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, **own_group(),
    )  # fmt: skip
    assert played.returncode == 0, played.stderr
    for name, fmt, _, recorded in jobs:
        assert f"{fmt} played {STEPS} steps of {ENVS} envs without mprl" in played.stdout
        same_actions(np.load(tmp_path / f"{name}.npy"), recorded["action"])


def test_the_player_cannot_import_mprl(tmp_path):
    """The player's Python really is one without mprl: its first lines, then ``import mprl``."""
    site = sysconfig.get_paths()["purelib"]
    head = PLAYER.split("import json")[0]
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", head + "import mprl\n", site],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, **own_group(),
    )  # fmt: skip
    assert proc.returncode == 1 and "ModuleNotFoundError: import of mprl halted" in proc.stderr
