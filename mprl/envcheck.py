"""What an environment returns on its first steps, checked: an env that gives NaN or inf
observations or rewards, an observation of another shape than its space's, a string reward,
``terminated`` that is no bool, is named where it first does so (the env, the field, the value
and what was expected), not many steps later as "probability tensor contains inf/nan" in a
network.

:func:`check_first_steps` watches a gymnasium env (the host's env factory hands out every env
so); :func:`check_parallel_first_steps` watches a PettingZoo parallel env agent by agent (the
env room's adapter does it to the env it adapts). Each checks every reset and step until the
env has taken :data:`FIRST_STEPS` steps, then puts the env's own methods back: after that a
step costs nothing more than the env's own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from mprl.spaces import agents_of

#: how many steps of each env are checked (its resets until then too)
FIRST_STEPS = 10

#: the kinds of numpy dtypes an observation may have: bool, integers, floats
NUMERIC = "biuf"


class EnvCheckError(ValueError):
    """An env returned what no env should (the module's docstring); the message, one line,
    names the env, the field, the value and what was expected."""


def check_first_steps(env: gym.Env, name: str, steps: int = FIRST_STEPS) -> gym.Env:
    """Check what ``env`` (called ``name`` in messages: its id) returns from ``reset`` and
    ``step`` until it has taken ``steps`` steps (:class:`EnvCheckError`); returns ``env``
    itself, its methods wrapped in place (an env without a ``__dict__`` is not checked)."""
    checks = _GymChecks(name, env.observation_space)
    _Watch.install(env, steps, checks.reset, checks.step)
    return env


def check_parallel_first_steps(env: Any, name: str, steps: int = FIRST_STEPS) -> None:
    """:func:`check_first_steps` for a PettingZoo parallel env: each agent's observation
    against its own space, reward, termination and truncation flags, and info."""
    checks = _ParallelChecks(name, env)
    _Watch.install(env, steps, checks.reset, checks.step)


class _Watch:
    """``obj.reset`` and ``obj.step`` replaced, on the instance, by methods that call the
    originals and hand what they return to ``check_reset(result)`` / ``check_step(result,
    step)``; after ``steps`` steps the originals are put back. A class, not closures: an env
    copied (``copy.deepcopy``) or pickled while watched keeps watching itself, not the
    original."""

    def __init__(self, obj: Any, steps: int, check_reset: Callable, check_step: Callable) -> None:
        self.obj, self.left, self.taken = obj, steps, 0
        self.check_reset, self.check_step = check_reset, check_step
        #: methods the instance had of its own before (another wrapper's): called, put back
        self.own = {m: vars(obj)[m] for m in ("reset", "step") if m in vars(obj)}

    @classmethod
    def install(cls, obj: Any, steps: int, check_reset: Callable, check_step: Callable) -> None:
        if steps <= 0 or not hasattr(obj, "__dict__"):
            return
        watch = cls(obj, steps, check_reset, check_step)
        obj.reset, obj.step = watch.reset, watch.step

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        own = self.own.get(method)
        if own is not None:
            return own(*args, **kwargs)
        return getattr(type(self.obj), method)(self.obj, *args, **kwargs)

    def reset(self, *args: Any, **kwargs: Any) -> Any:
        result = self._call("reset", *args, **kwargs)
        if self.left > 0:
            _said(self.check_reset, result)
        return result

    def step(self, *args: Any, **kwargs: Any) -> Any:
        result = self._call("step", *args, **kwargs)
        if self.left > 0:
            self.taken += 1
            self.left -= 1
            if not self.left:
                self._remove()
            _said(self.check_step, result, self.taken)
        return result

    def _remove(self) -> None:
        """The originals back where this watch's methods still are (a wrapper put around them
        since, ``mprl.timeline``'s, keeps calling them: they check nothing any more)."""
        mine = {"reset": self.reset, "step": self.step}
        for method, wrapped in mine.items():
            if vars(self.obj).get(method) != wrapped:
                continue
            if method in self.own:
                setattr(self.obj, method, self.own[method])
            else:
                delattr(self.obj, method)  # the class's method again


def _said(check: Callable, *args: Any) -> None:
    """``check(*args)``; what it finds is raised from here, its traceback ending at the env's
    reset or step, not in the checks."""
    try:
        check(*args)
    except EnvCheckError as exc:
        error = exc
    else:
        return
    raise error.with_traceback(None)


def show(value: Any, width: int = 60) -> str:
    """``value`` in one short line: an array's first and last items, a long text cut."""
    if isinstance(value, np.ndarray):
        text = np.array2string(value, threshold=6, edgeitems=2, max_line_width=10**6)
        text = " ".join(text.split())
    else:
        text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _kind(value: Any) -> str:
    return type(value).__name__


def _numbers(space: gym.spaces.Box) -> str:
    """What an observation of ``space`` is (said only when one is not: a space's ``repr``
    costs more than the checks)."""
    return f"{space.dtype} numbers of shape {space.shape} (its observation space {space})"


class _Fields:
    """The checks of a field each: :class:`EnvCheckError` saying what is wrong with it."""

    def __init__(self, name: str) -> None:
        self.name = name

    def fail(self, field: str, when: str, what: str, expected: str) -> EnvCheckError:
        return EnvCheckError(
            f"environment {self.name!r}: its {field} {when} {what}; expected {expected}"
        )

    def observation(self, value: Any, space: gym.Space, field: str, when: str) -> None:
        """``value`` against ``space``: a Box's shape, numbers (not text or objects), finite
        floats; Dict and Tuple spaces part by part; Discrete ones an integer."""
        if isinstance(space, gym.spaces.Box):
            self._array(value, space, field, when)
        elif isinstance(space, gym.spaces.Dict):
            if not isinstance(value, Mapping) or set(value) != set(space.spaces):
                keys = ", ".join(map(repr, space.spaces))
                raise self.fail(field, when, f"is {show(value)}", f"a dict of {keys}")
            for key, sub in space.spaces.items():
                self.observation(value[key], sub, f"{field}[{key!r}]", when)
        elif isinstance(space, gym.spaces.Tuple):
            if not isinstance(value, tuple | list) or len(value) != len(space.spaces):
                expected = f"a tuple of {len(space.spaces)}"
                raise self.fail(field, when, f"is {show(value)}", expected)
            for i, sub in enumerate(space.spaces):
                self.observation(value[i], sub, f"{field}[{i}]", when)
        elif isinstance(space, gym.spaces.Discrete) and not (
            np.ndim(value) == 0 and np.asarray(value).dtype.kind in "iu"
        ):
            raise self.fail(field, when, f"is {show(value)} ({_kind(value)})", "an integer")

    def _array(self, value: Any, space: gym.spaces.Box, field: str, when: str) -> None:
        try:
            array = np.asarray(value)
        except Exception:  # a ragged list, an object numpy cannot read
            raise self.fail(field, when, f"is {show(value)}", _numbers(space)) from None
        if array.dtype.kind not in NUMERIC:
            what = f"is {show(value)} ({_kind(value)} of {array.dtype})"
            raise self.fail(field, when, what, _numbers(space))
        if array.shape != space.shape:
            what = f"has shape {array.shape} ({show(array)})"
            raise self.fail(field, when, what, _numbers(space))
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            at = tuple(int(i) for i in np.argwhere(~np.isfinite(array))[0])
            bad = array[at]
            agents = agents_of(space)
            agent = f" (agent {agents[at[0]]!r})" if agents and at else ""
            what = f"holds {bad} at index {list(at)}{agent} ({show(array)})"
            raise self.fail(field, when, what, f"finite {_numbers(space)}")

    def number(self, value: Any, field: str, when: str) -> None:
        """A reward: a real number (a Python or numpy scalar, or a 0-d array), finite."""
        if type(value) is float or type(value) is int:  # the usual: no numpy call
            if not math.isfinite(value):
                raise self.fail(field, when, f"is {value}", "a finite number")
            return
        ndim = np.ndim(value)
        if ndim or np.asarray(value).dtype.kind not in NUMERIC:
            kind = _kind(value) + (f" of shape {np.shape(value)}" if ndim else "")
            raise self.fail(field, when, f"is {show(value)} ({kind})", "a number")
        if not np.isfinite(value):
            raise self.fail(field, when, f"is {value}", "a finite number")

    def flag(self, value: Any, field: str, when: str) -> None:
        """``terminated`` / ``truncated``: a bool (an integer 0 or 1 works alike)."""
        if isinstance(value, bool | np.bool_):
            return
        if isinstance(value, int | np.integer) and value in (0, 1):
            return
        raise self.fail(field, when, f"is {show(value)} ({_kind(value)})", "a bool")

    def info(self, value: Any, field: str, when: str) -> None:
        if not isinstance(value, Mapping):
            raise self.fail(field, when, f"is {show(value)} ({_kind(value)})", "a dict")

    def result(self, value: Any, method: str, size: int, expected: str) -> tuple:
        if not isinstance(value, tuple) or len(value) != size:
            what = f"{len(value)} values" if isinstance(value, tuple) else show(value)
            raise EnvCheckError(
                f"environment {self.name!r}: its {method} returned {what}; expected {expected} "
                "(gymnasium's API)"
            )
        return value


def _when(step: int) -> str:
    return "at reset" if step == 0 else f"at step {step}"


class _GymChecks(_Fields):
    """What a gymnasium env's ``reset`` and ``step`` return."""

    def __init__(self, name: str, space: gym.Space) -> None:
        super().__init__(name)
        self.space = space

    def reset(self, result: Any) -> None:
        obs, info = self.result(result, "reset", 2, "(observation, info)")
        self.observation(obs, self.space, "observation", "at reset")
        self.info(info, "info", "at reset")

    def step(self, result: Any, step: int) -> None:
        expected = "(observation, reward, terminated, truncated, info)"
        obs, reward, terminated, truncated, info = self.result(result, "step", 5, expected)
        when = _when(step)
        self.observation(obs, self.space, "observation", when)
        self.number(reward, "reward", when)
        self.flag(terminated, "terminated", when)
        self.flag(truncated, "truncated", when)
        self.info(info, "info", when)


class _ParallelChecks(_Fields):
    """What a PettingZoo parallel env's ``reset`` and ``step`` return: dicts by agent."""

    def __init__(self, name: str, env: Any) -> None:
        super().__init__(name)
        self.env = env

    def _by_agent(self, values: Any, field: str, when: str) -> Mapping:
        if not isinstance(values, Mapping):
            raise self.fail(field, when, f"are {show(values)} ({_kind(values)})", "a dict by agent")
        return values

    def _observations(self, values: Any, when: str) -> None:
        for agent, value in self._by_agent(values, "observations", when).items():
            space = self.env.observation_space(agent)
            self.observation(value, space, f"observation of agent {agent!r}", when)

    def _each(self, values: Any, field: str, when: str, check: Callable) -> None:
        for agent, value in self._by_agent(values, f"{field}s", when).items():
            check(value, f"{field} of agent {agent!r}", when)

    def reset(self, result: Any) -> None:
        observations, infos = self.result(result, "reset", 2, "(observations, infos)")
        self._observations(observations, "at reset")
        self._each(infos, "info", "at reset", self.info)

    def step(self, result: Any, step: int) -> None:
        expected = "(observations, rewards, terminations, truncations, infos)"
        observations, rewards, terminations, truncations, infos = self.result(
            result, "step", 5, expected
        )
        when = _when(step)
        self._observations(observations, when)
        self._each(rewards, "reward", when, self.number)
        self._each(terminations, "termination", when, self.flag)
        self._each(truncations, "truncation", when, self.flag)
        self._each(infos, "info", when, self.info)
