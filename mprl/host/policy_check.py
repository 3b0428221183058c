"""The main process plays the policy of the moment: the policy check behind "solved", and the
evaluation episodes of ``--eval-every``, with one player.

Training returns lag the policy: an asynchronous run can reach the threshold on episodes begun by
earlier, better weights while the current ones have drifted off, and then it would save a policy
that does not play as well as "solved" says. So once the mean of the last 100 training episodes
reaches the threshold, the policy is copied and played for :data:`CHECK_EPISODES` episodes with
sampled actions, as in training; the copy that passes is what the final checkpoint keeps.
"""

from __future__ import annotations

import copy
import functools
import statistics
import time
import traceback
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from mprl.host.envs import play_episodes, playing_episodes

CHECK_EPISODES = 10  # episodes the main process plays to confirm a run is solved
#: the longest an evaluation (--eval-every) plays at a time, between the run's supervision ticks
SLICE_S = 0.1


@contextmanager
def _one_torch_thread() -> Iterator[None]:
    """Torch ops on one thread in this process meanwhile. The main process plays the policy
    check while the children keep every core busy, and a second intra-op thread that gets no
    core slows every forward down (why: see benchmarks/README.md, "The solved check on one
    torch thread")."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _nothing() -> None:
    pass


class _Player:
    """A copy of the run's model (``model.act(obs_batch, deterministic)``) and environments of
    its own, made on first use, that the main process plays with: several environments side by
    side, one batched forward a step, on one torch thread, as the run's children keep the CPU
    busy. A model whose ``act`` fails or answers what an env cannot take is not played again
    (:attr:`broken`).

    :param model: the run's model; each play is of a copy of its weights of that moment.
    :param make_envs: makes the player's environments, on first use.
    :param algorithm: the algorithm's name, for the message when its ``act`` breaks.
    """

    def __init__(
        self, model: torch.nn.Module, make_envs: Callable[[], list[gym.Env]], algorithm: str
    ) -> None:
        self.model, self.make_envs, self.algorithm = model, make_envs, algorithm
        self.broken = not callable(getattr(model, "act", None))  # nothing to play it with
        self._player: tuple[torch.nn.Module, list[gym.Env]] | None = None
        #: brings the run's model up to date before a copy is made (the backend's refresh)
        self.refresh: Callable[[], None] = _nothing

    def _copy(self) -> tuple[torch.nn.Module, list[gym.Env]]:
        """The player's model, holding the run's weights of now, and its envs."""
        if self._player is None:
            self._player = (copy.deepcopy(self.model), self.make_envs())
        model, envs = self._player
        self.refresh()
        model.load_state_dict(self.model.state_dict())
        return model, envs

    def _broke(self, exc: Exception) -> dict[str, Any]:
        self.broken = True
        return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}

    def close(self) -> None:
        if self._player is not None:
            for env in self._player[1]:
                env.close()


class PolicyCheck(_Player):
    """Plays the run's model in ``CHECK_EPISODES`` environments side by side, with sampled
    actions as in training: the check behind "solved" on training returns."""

    def __init__(
        self, model: torch.nn.Module, make_envs: Callable[[], list[gym.Env]], algorithm: str
    ) -> None:
        super().__init__(model, make_envs, algorithm)
        self.passed: dict[str, torch.Tensor] | None = None  # the weights that passed

    def run(self, threshold: float, seed: int) -> dict[str, Any]:
        """Play the policy now; a record of the check (``mean_return``, ``check_s``, ``passed``).
        A model whose ``act`` fails or answers what an env cannot take is not played again: the
        record says so (``error``) and the training returns decide alone."""
        model, envs = self._copy()
        start = time.monotonic()
        try:
            with torch.random.fork_rng(devices=[]), torch.no_grad(), _one_torch_thread():
                torch.manual_seed(seed)
                returns, _ = play_episodes(envs, _checked(model.act), CHECK_EPISODES, False, seed)
        except Exception as exc:  # plugin code: it must never cost the run
            return {"passed": False, **self._broke(exc)}
        mean = sum(returns) / len(returns)
        passed = mean >= threshold
        if passed:
            self.passed = {k: v.clone() for k, v in model.state_dict().items()}
        return {
            "passed": passed, "mean_return": mean, "check_episodes": CHECK_EPISODES,
            "check_s": round(time.monotonic() - start, 3),
        }  # fmt: skip


class Evaluation(_Player):
    """Evaluation episodes (``--eval-every N --eval-episodes K``): once the run has taken the
    next multiple of N env steps, the policy of that moment (its weights copied) plays K
    episodes with its deterministic mode, ``act(obs_batch, deterministic=True)``: no
    exploration. Every evaluation plays the same K start states, episode ``i`` reset with a
    seed derived from the run's seed and ``i``, and torch seeded with the run's seed, as
    ``mprl eval RUN_DIR --deterministic --seed SEED --episodes K`` plays a checkpoint: the same
    weights give the same returns.

    It is played in slices of at most :data:`SLICE_S` seconds, one each time :meth:`advance`
    is called (every supervision tick), so the run's supervision never waits longer than that;
    one evaluation plays at a time, and those that come due meanwhile are skipped (the next one
    starts at the next multiple of N).

    :param every: N, env steps between evaluations.
    :param episodes: K, episodes of each.
    :param seed: the run's seed.
    :param env_steps: the run's env steps now (a resumed run's): the first one is at the next
        multiple of N.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        make_envs: Callable[[], list[gym.Env]],
        algorithm: str,
        *,
        every: int,
        episodes: int,
        seed: int,
        env_steps: int = 0,
    ) -> None:
        super().__init__(model, make_envs, algorithm)
        self.every, self.episodes, self.seed = every, episodes, seed
        self.next_at = (env_steps // every + 1) * every
        self._playing: Generator[None, None, tuple[list[float], list[int]]] | None = None
        self._rng = torch.Tensor()  # the evaluation's own torch generator state
        self._began: dict[str, Any] = {}  # step and wall of the weights played, seconds played

    @property
    def playing(self) -> bool:
        return self._playing is not None

    def advance(self, env_steps: int, wall_s: float) -> dict[str, Any] | None:
        """Start an evaluation if one is due (at ``env_steps``, ``wall_s`` into the run), and
        play the one going on for up to :data:`SLICE_S`. Returns the record of one that ended
        now (``source`` ``"eval"``, ``step`` and ``wall`` of the weights it played,
        ``eval_return_mean``, ``eval_return_std``, ``eval_length_mean``, ...) or, when the
        model's ``act`` failed, ``error`` and ``traceback`` (no evaluation is played again);
        else ``None``."""
        if self.broken:
            return None
        if self._playing is None:
            if env_steps < self.next_at:
                return None
            self.next_at = (env_steps // self.every + 1) * self.every
            model, envs = self._copy()
            self._playing = playing_episodes(
                envs, _checked(model.act), self.episodes, True, self.seed
            )
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed)
                self._rng = torch.get_rng_state()
            self._began = {"step": env_steps, "wall": round(wall_s, 4), "played_s": 0.0}
        start, played = time.monotonic(), None
        try:
            with torch.random.fork_rng(devices=[]), torch.no_grad(), _one_torch_thread():
                torch.set_rng_state(self._rng)
                try:
                    while True:  # one batched step at least
                        next(self._playing)
                        if time.monotonic() - start >= SLICE_S:
                            break
                except StopIteration as done:
                    played = done.value
                finally:
                    self._rng = torch.get_rng_state()
        except Exception as exc:  # plugin code: it must never cost the run
            self._playing = None
            return {"source": "eval", **self._began, **self._broke(exc)}
        self._began["played_s"] += time.monotonic() - start
        if played is None:
            return None
        self._playing, began, (returns, lengths) = None, self._began, played
        return {
            "source": "eval", "step": began["step"], "wall": began["wall"],
            "eval_return_mean": statistics.fmean(returns),
            "eval_return_std": statistics.pstdev(returns),
            "eval_length_mean": statistics.fmean(lengths),
            "eval_episodes": self.episodes,
            "eval_s": round(began["played_s"], 3),
            "eval_returns": returns, "eval_lengths": lengths,
        }  # fmt: skip

    def close(self) -> None:
        self._playing = None  # one still playing is left unfinished
        super().close()

    def weights(self) -> dict[str, torch.Tensor]:
        """A copy of the weights the last evaluation played."""
        assert self._player is not None
        return {k: v.clone() for k, v in self._player[0].state_dict().items()}


def _checked(act: Callable[..., Any]) -> Callable[[torch.Tensor, bool], Any]:
    """``act`` held to its contract: one action per observation, in a numpy array (or a list)
    of what the env's ``step`` takes; a torch tensor is not that."""

    @functools.wraps(act)  # play_episodes finds a recurrent model's begin_episode through it
    def checked(obs: torch.Tensor, deterministic: bool) -> Any:
        actions = act(obs, deterministic)
        if not isinstance(actions, np.ndarray | list | tuple) or len(actions) != len(obs):
            size = f" of length {len(actions)}" if isinstance(actions, list | tuple) else ""
            raise TypeError(
                f"act(obs_batch, deterministic) returned {type(actions).__name__}{size}; "
                f"expected a numpy array of {len(obs)} actions, one per observation"
            )
        return actions

    return checked
