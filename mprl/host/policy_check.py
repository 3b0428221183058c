"""The policy check behind "solved": the main process plays the policy of the moment.

Training returns lag the policy: an asynchronous run can reach the threshold on episodes begun by
earlier, better weights while the current ones have drifted off, and then it would save a policy
that does not play as well as "solved" says. So once the mean of the last 100 training episodes
reaches the threshold, the policy is copied and played for :data:`CHECK_EPISODES` episodes with
sampled actions, as in training; the copy that passes is what the final checkpoint keeps.
"""

from __future__ import annotations

import copy
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from mprl.host.envs import play_episodes

CHECK_EPISODES = 10  # episodes the main process plays to confirm a run is solved


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


class PolicyCheck:
    """Plays the run's model (``model.act(obs_batch, deterministic)``) in ``CHECK_EPISODES``
    environments side by side, one batched forward a step: the check competes with the run's
    children for the CPU.

    :param model: the run's model; each check plays a copy of its weights of that moment.
    :param make_envs: makes the check's environments, on first use.
    :param algorithm: the algorithm's name, for the message when its ``act`` breaks.
    """

    def __init__(
        self, model: torch.nn.Module, make_envs: Callable[[], list[gym.Env]], algorithm: str
    ) -> None:
        self.model, self.make_envs, self.algorithm = model, make_envs, algorithm
        self.broken = not callable(getattr(model, "act", None))  # nothing to play it with
        self._player: tuple[torch.nn.Module, list[gym.Env]] | None = None
        self.passed: dict[str, torch.Tensor] | None = None  # the weights that passed

    def run(self, threshold: float, seed: int) -> dict[str, Any]:
        """Play the policy now; a record of the check (``mean_return``, ``check_s``, ``passed``).
        A model whose ``act`` fails or answers what an env cannot take is not played again: the
        record says so (``error``) and the training returns decide alone."""
        if self._player is None:
            self._player = (copy.deepcopy(self.model), self.make_envs())
        model, envs = self._player
        model.load_state_dict(self.model.state_dict())
        start = time.monotonic()
        try:
            with torch.random.fork_rng(devices=[]), torch.no_grad(), _one_torch_thread():
                torch.manual_seed(seed)
                returns, _ = play_episodes(envs, _checked(model.act), CHECK_EPISODES, False, seed)
        except Exception as exc:  # plugin code: it must never cost the run
            self.broken = True
            return {
                "passed": False, "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(),
            }  # fmt: skip
        mean = sum(returns) / len(returns)
        passed = mean >= threshold
        if passed:
            self.passed = {k: v.clone() for k, v in model.state_dict().items()}
        return {
            "passed": passed, "mean_return": mean, "check_episodes": CHECK_EPISODES,
            "check_s": round(time.monotonic() - start, 3),
        }  # fmt: skip

    def close(self) -> None:
        if self._player is not None:
            for env in self._player[1]:
                env.close()


def _checked(act: Callable[..., Any]) -> Callable[[torch.Tensor, bool], Any]:
    """``act`` held to its contract: one action per observation, in a numpy array (or a list)
    of what the env's ``step`` takes; a torch tensor is not that."""

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
