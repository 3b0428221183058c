"""Playing a trained policy: ``python -m mprl eval RUN_DIR|CHECKPOINT``."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from mprl.environments.agents import AgentReturns
from mprl.errors import UsageError
from mprl.host import checkpoint
from mprl.host.envs import make_env, play_episodes
from mprl.host.loading import Checkpoint, checked_env, resolved, restored
from mprl.host.plugins import PluginManager, get_plugin_manager
from mprl.host.rundir import atomic_write
from mprl.spaces import agents_of, teams_of


def evaluate(
    source: str | Path,
    *,
    episodes: int = 10,
    deterministic: bool = False,
    seed: int = 0,
    video_dir: str | Path | None = None,
    out: str | Path | None = None,
    plugins: PluginManager | None = None,
    env: str | None = None,
) -> dict[str, Any]:
    """Play ``episodes`` episodes with the policy of a run directory's last checkpoint (or of a
    checkpoint file) and write the results as JSON; returns them.

    The policy is the checkpoint's model as :func:`mprl.load` gives it (rebuilt by its
    algorithm with its config, for the env played here); it acts
    through the model's ``act(obs_batch, deterministic) -> actions`` method (the models of
    :mod:`mprl.lib.nets` have one). Episode ``i`` is reset with a seed derived from ``seed`` and
    ``i``, so an evaluation is repeatable. ``video_dir`` records every episode with gymnasium's
    ``RecordVideo`` (needs ``moviepy``). ``env`` must be the checkpoint's env id when given; an
    id that imports a module (``module:Env-v0``) is only made when the user gives it. The JSON
    goes to ``out``, by default ``eval.json`` in
    the run directory (``<checkpoint>.eval.json`` next to a checkpoint file outside one).
    """
    file, data, target = _inputs(source, episodes, video_dir, env, out)
    pm = plugins or get_plugin_manager()
    plugin, algo, config, run = resolved(pm, file, data)
    env_id = run.env
    env = make_env(pm, env_id, seed=seed, render_mode="rgb_array" if video_dir else None)
    try:
        loaded = restored(
            file, data, pm, plugin, algo, config, run, env.observation_space, env.action_space
        )
        if video_dir is not None:
            from gymnasium.wrappers import RecordVideo

            env = RecordVideo(
                env, str(video_dir), episode_trigger=lambda _: True, name_prefix="eval"
            )
        agents = agents_of(env.observation_space)
        if agents is not None:
            env = AgentReturns(env)
        returns, lengths = _play(env, env_id, _policy(loaded), episodes, deterministic, seed)
    finally:
        env.close()
    result = {
        "checkpoint": str(file),
        "algorithm": algo.name,
        "env": env_id,
        "env_steps_trained": int(data.get("env_steps", 0)),
        "episodes": episodes,
        "deterministic": deterministic,
        "seed": seed,
        **_statistics(returns, lengths),
        **(_per_agent(agents, env.returns) if isinstance(env, AgentReturns) else {}),
        "video_dir": str(video_dir) if video_dir is not None else None,
    }
    atomic_write(target, lambda f: f.write((json.dumps(result, indent=2) + "\n").encode()))
    result["written_to"] = str(target)
    return result


def _play(
    env: gym.Env, env_id: str, act: Any, episodes: int, deterministic: bool, seed: int
) -> tuple[list[float], list[int]]:
    with torch.random.fork_rng(devices=[]):  # sampled actions repeat for a seed
        torch.manual_seed(seed)
        try:
            return play_episodes([env], act, episodes, deterministic, seed)
        except gym.error.DependencyNotInstalled as exc:  # rendering needs e.g. pygame
            raise UsageError(f"--video: {env_id} cannot render frames: {exc}") from None


def _per_agent(agents: tuple[str, ...], returns: list[list[float]]) -> dict[str, Any]:
    """Each agent's mean return and returns, for a multi-agent env (whose ``returns`` are the
    mean of all the agents'), and where the agents' names make several teams
    (:func:`mprl.spaces.teams_of`: a competitive env; not one per agent) each team's, the mean
    of its agents'."""
    columns = list(zip(*returns, strict=True))
    result: dict[str, Any] = {
        "agents": {
            name: {"mean_return": statistics.fmean(col), "returns": list(col)}
            for name, col in zip(agents, columns, strict=True)
        }
    }
    teams = teams_of(agents)
    if 1 < len(teams) < len(agents):  # one team per agent would repeat the agents' returns
        result["teams"] = {}
        for team, rows in teams.items():
            each = [statistics.fmean(episode[r] for r in rows) for episode in returns]
            result["teams"][team] = {"mean_return": statistics.fmean(each), "returns": each}
    return result


def _statistics(returns: list[float], lengths: list[int]) -> dict[str, Any]:
    return {
        "mean_return": statistics.fmean(returns),
        "std_return": statistics.pstdev(returns),
        "mean_length": statistics.fmean(lengths),
        "std_length": statistics.pstdev(lengths),
        "returns": returns,
        "lengths": lengths,
    }


def _inputs(
    source: str | Path,
    episodes: int,
    video_dir: str | Path | None,
    env: str | None,
    out: str | Path | None,
) -> tuple[Path, dict[str, Any], Path]:
    """The checkpoint file, its data and where the results go, each checked."""
    if episodes < 1:
        raise UsageError(f"--episodes must be at least 1, not {episodes}")
    if video_dir is not None:
        try:
            import moviepy  # noqa: F401 - gymnasium's video recorder writes with it
        except ImportError:
            raise UsageError(
                '--video needs moviepy: pip install "mprl[video]" (or "gymnasium[other]")'
            ) from None
    file, data = checkpoint.load(source)
    checked_env(file, data, env)
    target = _checked_out(Path(out) if out is not None else _default_out(file), file)
    return file, data, target


def _policy(loaded: Checkpoint) -> Any:
    """The loaded model's ``act``, which eval plays with."""
    act = getattr(loaded.model, "act", None)
    if not callable(act):
        raise UsageError(
            f"algorithm {loaded.algorithm!r}: its model ({type(loaded.model).__name__}) has no "
            "act(obs_batch, deterministic) method, which eval plays with; add one to it"
        )
    return act


def _checked_out(target: Path, source: Path) -> Path:
    """Where the results go, refused before anything is played if it cannot take them."""
    if target.is_dir():
        raise UsageError(f"--out {str(target)!r} is a directory; give the path of a JSON file")
    if not target.parent.is_dir():
        raise UsageError(f"--out {str(target)!r}: directory {str(target.parent)!r} does not exist")
    if not os.access(target.parent, os.W_OK):  # refused now, not after every episode is played
        raise UsageError(
            f"--out {str(target)!r}: directory {str(target.parent)!r} is not writable; give "
            "--out FILE somewhere writable"
        )
    if target.exists() and target.samefile(source):
        raise UsageError(
            f"--out {str(target)!r} is the checkpoint being evaluated; it would be overwritten "
            "with the results: give another file"
        )
    return target


def _default_out(file: Path) -> Path:
    if file.parent.name == "checkpoints" and (file.parent.parent / "config.json").exists():
        return file.parent.parent / "eval.json"
    return file.with_name(file.name + ".eval.json")
