"""The hooks a plugin can implement. Every hook is named ``mprl_*``; implement it as a function of
the same name decorated with :data:`mprl.hookimpl` in the module your ``mprl`` entry point names.

Hooks run in the main process unless their docstring says otherwise. A plugin implements only the
hooks it needs and may accept any subset of a hook's parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mprl import hookspec

if TYPE_CHECKING:
    import gymnasium as gym

    from mprl.algorithm import Algorithm
    from mprl.backend import Backend
    from mprl.runner import RunInfo

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

        @mprl.hookimpl
        def mprl_register_algorithms(register):
            register(mprl.Algorithm(name="reinforce", config_cls=Config,
                                    make_model=make_model, worker=worker))
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

        @mprl.hookimpl
        def mprl_make_env(env_id):
            if env_id == "Corridor-v0":
                return Corridor()
    """


# --------------------------------------------------------------------------------------------
# Execution backend
# --------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def mprl_make_backend(name: str) -> Backend | None:
    """Provide the backend that runs a job's processes, selected with ``--backend NAME``.

    The built-in ``local`` backend spawns processes on this machine. Algorithms never see the
    backend: their worker and train functions only use the :class:`mprl.Context` they are given,
    so the same algorithm plugin runs unchanged on any backend.

    :param name: the backend name asked for.
    :returns: an object implementing :class:`mprl.backend.Backend`, or ``None`` if this plugin does
        not provide ``name``. firstresult.

    Example::

        @mprl.hookimpl
        def mprl_make_backend(name):
            if name == "ray":
                return RayBackend()
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

        @mprl.hookimpl
        def mprl_run_start(run):
            print(f"training {run.algorithm} on {run.config.env} into {run.run_dir}")
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

        @mprl.hookimpl
        def mprl_report_metrics(records):
            for r in records:
                if "episode_return" in r:
                    writer.add_scalar("return", r["episode_return"], r["step"])
    """


@hookspec
def mprl_run_end(run: RunInfo, summary: Mapping[str, Any]) -> None:
    """A run has ended and every process has stopped; ``summary.json`` is written.

    :param run: the run that ended.
    :param summary: the content of ``summary.json`` (``status``, ``solved``, ``env_steps``,
        ``episodes``, ``wall_s``, ``mean_return_100``, ...).
    :returns: nothing. Not firstresult.

    Example::

        @mprl.hookimpl
        def mprl_run_end(summary):
            notify(f"run ended: {summary['status']}")
    """
