"""What the check of an env's first steps (:mod:`mprl.envcheck`) costs: env steps/s of an env
the host's env factory made (checked for its first steps, then its own methods again) against
the same env made without the check, in one invocation, interleaved.

    python benchmarks/env_check.py [--steps 200000] [--repeats 5]

Per env (CartPole-v1 through gymnasium, mpe2's simple_spread_v3 through the PettingZoo
adapter): the env made by :func:`mprl.host.envs.make_env` and stepped past its checked steps,
and the same env with the check taken off by hand before its first step, each stepping
``--steps`` random actions (resetting where an episode ends), ``--repeats`` times in turn, each
first in every other repeat. Printed: steps/s, median (min-max), the ratio checked / unchecked,
and what a checked step (one of the first :data:`mprl.envcheck.FIRST_STEPS`) costs more, in
microseconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._stats import median_range
from mprl.envcheck import FIRST_STEPS
from mprl.host.envs import make_env
from mprl.host.plugins import get_plugin_manager

ENVS = ("CartPole-v1", "mpe2:simple_spread_v3(N=3)")


def _unchecked(env: Any) -> Any:
    """``env`` with the watch of its first steps taken off: its own methods, as after them."""
    for obj in (env, getattr(env, "env", None)):  # the adapter's parallel env too
        for method in ("reset", "step"):
            if obj is not None and method in vars(obj):
                delattr(obj, method)
    return env


def _steps_per_s(env: Any, steps: int) -> float:
    env.reset(seed=0)
    actions = [env.action_space.sample() for _ in range(1000)]
    start = time.perf_counter()
    for i in range(steps):
        *_, terminated, truncated, _ = env.step(actions[i % 1000])
        if terminated or truncated:
            env.reset()
    return steps / (time.perf_counter() - start)


def _checked_step_us(pm: Any, env_id: str, envs: int = 200) -> float:
    """Microseconds a checked step costs more than an unchecked one, over ``envs`` fresh
    envs' first steps."""
    made = [make_env(pm, env_id) for _ in range(2 * envs)]
    spent = []
    for i, env in enumerate(made):
        if i % 2:
            _unchecked(env)
        env.reset(seed=0)
        action = env.action_space.sample()
        start = time.perf_counter()
        for _ in range(FIRST_STEPS):
            *_, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                env.reset()
        spent.append(time.perf_counter() - start)
    checked, unchecked = statistics.median(spent[0::2]), statistics.median(spent[1::2])
    return (checked - unchecked) / FIRST_STEPS * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    pm = get_plugin_manager()
    for env_id in ENVS:
        checked, unchecked = make_env(pm, env_id), _unchecked(make_env(pm, env_id))
        _steps_per_s(checked, FIRST_STEPS)  # its checked steps: the watch is gone after them
        assert "step" not in vars(checked), "still watched"
        rates: dict[str, list[float]] = {"checked": [], "unchecked": []}
        steps = args.steps if env_id == ENVS[0] else args.steps // 20
        for repeat in range(args.repeats):
            order = ("checked", "unchecked") if repeat % 2 else ("unchecked", "checked")
            for which in order:  # each first in every other repeat
                env = checked if which == "checked" else unchecked
                rates[which].append(_steps_per_s(env, steps))
        ratio = statistics.median(rates["checked"]) / statistics.median(rates["unchecked"])
        print(f"{env_id}: steps/s after the checked steps {median_range(rates['checked'], ',.0f')}"
              f", never checked {median_range(rates['unchecked'], ',.0f')}, ratio {ratio:.3f}; "
              f"a checked step costs {_checked_step_us(pm, env_id):.1f} us more")  # fmt: skip


if __name__ == "__main__":
    main()
