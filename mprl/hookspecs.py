"""The hooks a plugin can implement. Every hook is named ``mprl_*``; implement it as a function of
the same name decorated with :data:`mprl.hookimpl` in the module your ``mprl`` entry point names.

Hooks run in the main process unless their docstring says otherwise. A plugin implements only the
hooks it needs and may accept any subset of a hook's parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import gymnasium as gym

    from mprl.algorithm import Algorithm
    from mprl.run_types import RunConfig, RunInfo

#: the plugin project name: entry-point group, hook prefix
NAME = "mprl"
hookspec = pluggy.HookspecMarker(NAME)
#: mark a plugin's function as the implementation of the hook of the same name
hookimpl = pluggy.HookimplMarker(NAME)


def __getattr__(name: str) -> Any:
    """0.1.0's ``mprl_make_backend`` spec, with a warning (see :mod:`mprl.deprecated`)."""
    from mprl import deprecated  # not at the top: this module imports nothing of mprl

    return deprecated.forward(__name__, stacklevel=3)(name)


# --------------------------------------------------------------------------------------------
# Registration: what a plugin contributes
# --------------------------------------------------------------------------------------------


@hookspec
def mprl_register_algorithms(register: Callable[[Algorithm], None]) -> None:
    """Register the algorithms this plugin provides.

    Called once per plugin manager, in the main process and in every spawned child that needs to
    look an algorithm up. Call ``register`` once per algorithm; registering a name another plugin
    already registered is an error naming both plugins.

    :param register: call it with an :class:`mprl.Algorithm` (name, attrs config class, shared-state
        schema, model factory, worker function, optional train function).
    :returns: nothing; the return value is ignored. Not firstresult: every plugin is called.

    Example::

        import attrs
        import torch

        import mprl


        @attrs.frozen
        class Config:
            hidden: int = 32


        def make_model(observation_space, action_space, config):
            return torch.nn.Sequential(
                torch.nn.Linear(observation_space.shape[0], config.hidden),
                torch.nn.Tanh(),
                torch.nn.Linear(config.hidden, action_space.n),
            )


        def worker(ctx):  # at top level: spawned workers import it by name
            env = ctx.make_env()
            while not ctx.should_stop():  # play the shared model greedily; a real one also learns
                (obs, _), done, episode_return, length = env.reset(), False, 0.0, 0
                while not done:
                    with torch.no_grad():
                        action = int(ctx.model(torch.as_tensor(obs)).argmax())
                    obs, reward, terminated, truncated, _ = env.step(action)
                    episode_return, length = episode_return + reward, length + 1
                    done = terminated or truncated
                ctx.add_steps(length)
                ctx.log_episode(episode_return, length)


        @mprl.hookimpl
        def mprl_register_algorithms(register):
            register(
                mprl.Algorithm(
                    name="greedy",
                    config_cls=Config,
                    make_model=make_model,
                    worker=worker,
                    description="plays the shared model greedily, never learns",
                )
            )
    """


# --------------------------------------------------------------------------------------------
# Environments
# --------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def mprl_make_env(
    env_id: str, seed: int, rank: int, index: int, render_mode: str | None
) -> gym.Env | None:
    """Create the environment ``env_id`` for one worker.

    Called in the main process once before anything starts (to check the id and the spaces) and in
    each worker process for every environment it asks for, so implement it in a module that spawned
    children can import (an entry-point plugin). The built-in implementation, tried last, calls
    ``gymnasium.make(env_id)``; return ``None`` for ids you do not handle.

    :param env_id: the id given with ``--env``.
    :param seed: the seed this environment will be reset with (the core seeds it after creation).
    :param rank: the worker's rank, ``-1`` in the main process and the train process.
    :param index: which of the worker's environments this is (0 for the first).
    :param render_mode: ``None`` in training; ``"rgb_array"`` when ``python -m mprl eval --video``
        records episodes (pass it to ``gymnasium.make``).
    :returns: a ``gymnasium.Env``, or ``None`` to let the next plugin try. firstresult: the first
        non-``None`` value wins.

    Example::

        import gymnasium

        import mprl


        @mprl.hookimpl
        def mprl_make_env(env_id, render_mode):
            if env_id != "CartPole-1000-v0":  # CartPole with 1000-step episodes
                return None
            return gymnasium.make("CartPole-v1", max_episode_steps=1000, render_mode=render_mode)
    """


@hookspec(firstresult=True)
def mprl_adapt_env(env: Any, env_id: str) -> gym.Env | None:
    """Turn what a plugin's ``mprl_make_env`` returned that is not a ``gymnasium.Env`` into one.

    Asked only for such a value, in whatever process made it. The built-in implementation, tried
    last, adapts a PettingZoo parallel env (one gymnasium env with an agent dimension,
    :class:`mprl.lib.marl.AgentEnv`) and refuses a PettingZoo AEC env, saying how to convert it.

    :param env: what ``mprl_make_env`` returned.
    :param env_id: the id it was made for.
    :returns: a ``gymnasium.Env``, or ``None`` for values you do not know. firstresult: the first
        non-``None`` value wins. Raise :class:`mprl.errors.UsageError` for a value you know but
        cannot adapt: the error names the plugin that returned it.

    Example::

        import gymnasium

        import mprl


        class Coin:  # an env of another library: step() -> (obs, reward, done)
            def reset(self):
                return 0

            def step(self, action):
                return 0, float(action == 1), True


        class CoinEnv(gymnasium.Env):
            observation_space = gymnasium.spaces.Discrete(1)
            action_space = gymnasium.spaces.Discrete(2)

            def __init__(self, coin):
                self.coin = coin

            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                return self.coin.reset(), {}

            def step(self, action):
                obs, reward, done = self.coin.step(action)
                return obs, reward, done, False, {}


        @mprl.hookimpl
        def mprl_make_env(env_id):
            return Coin() if env_id == "Coin-v0" else None


        @mprl.hookimpl
        def mprl_adapt_env(env):
            return CoinEnv(env) if isinstance(env, Coin) else None
    """


@hookspec
def mprl_check_env(run: RunConfig) -> None:
    """Refuse, before anything starts, a run whose env cannot be made as its options ask.

    The options: ``--env``, ``--env-batch``, a plugin's own. Called in the main process when a
    run, a resume or :func:`mprl.load` resolves its run options, before any env is made. The
    built-in implementation refuses ``--env-batch envpool`` for an env EnvPool does not have, or
    without EnvPool installed.

    :param run: the run's options, with ``run.env`` the env id the run will make.
    :returns: nothing; raise :class:`mprl.errors.UsageError` with one line naming the option
        and the fix to refuse the run (exit 2, nothing started). Not firstresult: every plugin
        is called.

    Example::

        import mprl
        from mprl.errors import UsageError


        @mprl.hookimpl
        def mprl_check_env(run):
            if run.env == "Corridor-v0" and run.env_batch != "gym":
                raise UsageError(
                    f"--env-batch {run.env_batch}: Corridor-v0 has no batched version; "
                    "use --env-batch gym"
                )
    """


@hookspec(firstresult=True)
def mprl_env_workload(env_id: str) -> str | None:
    """Which workload ``env_id`` is: the key of an algorithm's ``presets`` that applies to it.

    Called in the main process when a run's config is built. The built-in implementation, tried
    last, says ``"atari"`` for ale-py's games and ``"mujoco"`` for gymnasium's MuJoCo envs.

    :param env_id: the run's env id.
    :returns: a workload name (``"atari"``, ``"mujoco"``, or one of your own that algorithms
        can key presets by), or ``None`` when you do not know the id. firstresult: the first
        non-``None`` value wins.

    Example::

        import mprl


        @mprl.hookimpl
        def mprl_env_workload(env_id):
            if env_id.startswith("MyPong"):  # a plugin's own Atari-like envs: Atari's presets
                return "atari"
            return None
    """


# --------------------------------------------------------------------------------------------
# Execution backend
# --------------------------------------------------------------------------------------------


@hookspec
def mprl_register_backends(register: Callable[..., None]) -> None:
    """Register the backends this plugin provides: where a run's processes live (``--backend``).

    Built in: ``local`` spawns processes on this machine; ``serial`` (``run --serial``) runs them
    as turn-taking threads of the main process, for debugging and tests; ``ray`` runs them as Ray
    actors on this machine or a cluster (``pip install "mprl[ray]"``). Algorithms never see the
    backend: their worker and train functions only use the :class:`mprl.Context` they are given,
    so the same algorithm plugin runs unchanged on any backend. ``python -m mprl plugins`` lists
    the backends and who provides them.

    :param register: call it as ``register(name, factory, description="")``: ``factory()``
        returns a new :class:`mprl.backends.base.Backend` for each run. The first registration
        of a name wins (a plugin marked ``tryfirst=True`` overrides a built-in backend).
    :returns: nothing. Not firstresult: every plugin is called.

    Example::

        import mprl
        from mprl.backends.local import LocalBackend


        class QuietLocal(LocalBackend):  # the local backend, with a word at the start
            def prepare(self, job):
                print(f"starting {len(job.roles())} processes")
                return super().prepare(job)


        @mprl.hookimpl
        def mprl_register_backends(register):
            register("quiet-local", QuietLocal, "the local backend, saying how many processes")
    """


@hookspec
def mprl_register_options(register: Callable[[type], None]) -> None:
    """Register the run options this plugin owns (a backend's, a reporter's).

    Each field of a registered attrs class becomes a run option like ``--workers``: a flag of
    ``mprl run`` (``--field-name``, listed by ``mprl run --help`` under the plugin's name), a key
    of a config file's ``[run]`` table, a keyword of :func:`mprl.run`, and a key of ``run`` in
    ``config.json`` and checkpoints. Values are checked against the field's type and validators
    before anything starts (exit 2 naming the field); read them with ``run.of(TheClass)`` on the
    run's :class:`mprl.RunConfig` (``ctx.run``, ``job.run``, ``RunInfo.run``).

    :param register: call it with an attrs class whose every field has a default and a
        ``metadata={"help": ...}``. A field name the core or another plugin already uses is an
        error naming both.
    :returns: nothing. Not firstresult: every plugin is called.

    Example::

        import attrs
        import mprl


        @attrs.frozen
        class SlackOptions:
            slack_channel: str = attrs.field(default="", metadata={"help": "post the summary here"})


        @mprl.hookimpl
        def mprl_register_options(register):
            register(SlackOptions)


        @mprl.hookimpl
        def mprl_run_end(run, summary):
            channel = run.run.of(SlackOptions).slack_channel
            if channel:
                print(f"to {channel}: {run.algorithm} {summary['status']}")
    """


# --------------------------------------------------------------------------------------------
# Run lifecycle and reporting
# --------------------------------------------------------------------------------------------


@hookspec
def mprl_run_start(run: RunInfo) -> None:
    """A run is about to start its processes (configuration checked, run directory created).

    :param run: what the run is: plugin and algorithm names, resolved configs, run directory.
    :returns: nothing. Not firstresult: every plugin is called.

    Example::

        import mprl


        @mprl.hookimpl
        def mprl_run_start(run):
            print(f"training {run.algorithm} on {run.run.env} with {run.run.workers} workers")
            print(f"writing to {run.run_dir}")
    """


@hookspec
def mprl_report_metrics(run: RunInfo, records: Sequence[Mapping[str, Any]]) -> None:
    """Receive metric records as the main process collects them (reporters: TensorBoard, W&B ...).

    Each record is the same mapping written as one line of ``metrics.jsonl``: ``wall`` (seconds
    since start), ``step`` (total env steps), ``source`` (``worker:RANK``, ``trainer`` or
    ``main``) and the values (``episode_return``, ``episode_length``, losses, ``steps_per_s``, ...).
    Called in the main process, in batches, never on a worker's hot path.

    :param run: the run the records belong to.
    :param records: the new records, oldest first.
    :returns: nothing. Not firstresult.

    Example::

        import csv

        import mprl


        @mprl.hookimpl
        def mprl_report_metrics(run, records):
            with open(run.run_dir / "returns.csv", "a", newline="") as f:
                rows = csv.writer(f)
                for r in records:
                    if "episode_return" in r:
                        rows.writerow([r["step"], r["source"], r["episode_return"]])
    """


@hookspec
def mprl_run_end(run: RunInfo, summary: Mapping[str, Any]) -> None:
    """A run has ended and every process has stopped; ``summary.json`` is written.

    :param run: the run that ended.
    :param summary: the content of ``summary.json`` (``status``, ``solved``, ``env_steps``,
        ``episodes``, ``wall_s``, ``mean_return_100``, ...).
    :returns: nothing. Not firstresult.

    Example::

        import mprl


        @mprl.hookimpl
        def mprl_run_end(run, summary):
            status, mean = summary["status"], summary["mean_return_100"]
            with open(run.run_dir / "result.txt", "w") as f:
                print(f"{run.algorithm}: {status}, mean return {mean}", file=f)
    """


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------


@hookspec
def mprl_register_commands(register: Callable[..., None]) -> None:
    """Register the commands this plugin adds to ``python -m mprl`` (``sweep`` is one).

    Called once per plugin manager, in the main process, when the command line is read;
    ``python -m mprl --help`` lists the commands and ``python -m mprl plugins`` who provides
    them. Each command gets ``-p no:NAME`` like the core's.

    :param register: call it as ``register(name, help, add_arguments, run)``: ``name`` the
        command (``python -m mprl NAME``), ``help`` its line in ``--help``,
        ``add_arguments(parser, plugins)`` adds its arguments to its ``argparse`` parser, and
        ``run(args, plugins)`` runs it with the parsed ``argparse.Namespace`` and returns the
        exit code (raise :class:`mprl.errors.UsageError` for bad input: one line, exit 2).
        ``plugins`` is the :class:`mprl.host.plugins.PluginManager` the command line was read
        with. A name that the core or another plugin already uses is an error naming both.
    :returns: nothing. Not firstresult: every plugin is called.

    Example::

        import mprl


        def add_arguments(parser, plugins):
            parser.description = "Say hello to an installed algorithm."
            parser.add_argument("algorithm", help="an algorithm's name")


        def hello(args, plugins):
            plugin, algorithm = plugins.algorithm(args.algorithm)
            print(f"hello, {algorithm.name} of plugin {plugin}")
            return 0


        @mprl.hookimpl
        def mprl_register_commands(register):
            register("hello", "greet an algorithm", add_arguments, hello)
    """
