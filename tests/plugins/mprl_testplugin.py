"""A plugin used by the test suite, installed as its own distribution (see conftest.py).

Its algorithm ``probe`` uses every part of the Context and injects the faults of docs/faults.md
on request (``--set fault=...``: raise, exit with a code, SIGKILL itself, hang, ignore the stop
flag and SIGTERM), in every incarnation of a rank or only the first ones. Its env ``Corridor-v0`` only exists through this plugin's ``mprl_make_env`` hook, so a
worker that creates it proves entry-point plugins load inside spawned children.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import gymnasium as gym
import numpy as np
import torch

import mprl
from mprl import schema


class Corridor(gym.Env):
    """Walk right to the end of a corridor: reward 1 per step, 10 steps long."""

    metadata: dict = {"render_modes": []}

    def __init__(self, length: int = 10) -> None:
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.length = length
        self.pos = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return np.zeros(1, dtype=np.float32), {}

    def step(self, action):
        self.pos += 1
        obs = np.array([self.pos / self.length], dtype=np.float32)
        return obs, 1.0, self.pos >= self.length, False, {}


class Ledge(Corridor):
    """The corridor with a ledge beside it: action 1 steps off it, which ends the episode with
    no reward; walking on to the end (10 steps) scores the env's reward threshold, 10."""

    def __init__(self, render_mode: str | None = None) -> None:
        super().__init__()

    def step(self, action):
        if action == 1:
            return np.array([self.pos / self.length], dtype=np.float32), 0.0, True, False, {}
        return super().step(action)


if "Ledge-v0" not in gym.registry:  # this module may be imported twice in one process
    gym.register("Ledge-v0", entry_point=Ledge, reward_threshold=10.0, max_episode_steps=50)


class Switches(Corridor):
    """Same corridor, but a MultiBinary action space no built-in algorithm supports."""

    def __init__(self) -> None:
        super().__init__()
        self.action_space = gym.spaces.MultiBinary(3)


class Rooms(Corridor):
    """The corridor seen as a Dict observation, which the built-in MLP plugins cannot take."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = gym.spaces.Dict({"pos": self.observation_space})


if "OldStyle-v0" not in gym.registry:  # an env whose constructor takes no render_mode
    gym.register("OldStyle-v0", entry_point=Corridor, max_episode_steps=50)


FAULTS = (
    "none", "raise", "exit", "sigkill", "hang", "ignore_stop", "breakpoint", "raise_at_stop",
    "orphans", "daemons",
)  # fmt: skip


@attrs.frozen
class ProbeConfig:
    fault: str = attrs.field(
        default="none",
        validator=attrs.validators.in_(FAULTS),
        metadata={"help": "what goes wrong at fault_at_step: " + ", ".join(FAULTS)},
    )
    fault_at_step: int = attrs.field(default=0, metadata={"help": "the worker's step of the fault"})
    fault_rank: int = attrs.field(default=-1, metadata={"help": "rank with the fault (-1: all)"})
    fault_times: int = attrs.field(
        default=0, metadata={"help": "only while restarts < this (0: every incarnation)"}
    )
    exit_code: int = attrs.field(default=3, metadata={"help": "code for fault=exit"})
    ignore_sigterm: bool = attrs.field(default=False, metadata={"help": "children ignore SIGTERM"})
    trainer_fault: str = attrs.field(
        default="none",
        validator=attrs.validators.in_(FAULTS),
        metadata={
            "help": "what goes wrong in the train process once the run has fault_at_step steps"
        },
    )
    step_sleep: float = attrs.field(default=0.0, metadata={"help": "seconds to sleep per step"})
    model_tensors: int = attrs.field(default=1, metadata={"help": "extra parameter tensors"})
    train_action: int = attrs.field(default=-1, metadata={"help": "workers' action (-1: random)"})
    play_action: int = attrs.field(
        default=-1, metadata={"help": "the action the model's act() plays (-1: it has no act)"}
    )
    act_returns: str = attrs.field(
        default="list",
        validator=attrs.validators.in_(("list", "tensor", "raise")),
        metadata={"help": "what act() answers: a list, a torch tensor (wrong), or it raises"},
    )


@attrs.frozen
class ProbeOptions:
    """A run option this plugin owns: every process logs it back (a value from the command
    line to a child and back)."""

    probe_tag: str = attrs.field(default="", metadata={"help": "a tag every process logs back"})


@mprl.hookimpl
def mprl_register_options(register):
    register(ProbeOptions)


def inject(ctx: mprl.Context, fault: str) -> None:
    """Make ``fault`` happen in this process now."""
    if fault == "raise":
        raise RuntimeError(f"injected failure in {ctx.source} (restart {ctx.restarts})")
    if fault == "exit":
        os._exit(ctx.config.exit_code)
    if fault == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "hang":
        time.sleep(3600)  # no heartbeat: should_stop is never called again
    if fault == "breakpoint":
        breakpoint()
    if fault == "ignore_stop":
        while True:  # never returns, heartbeat or not
            time.sleep(0.05)
    if fault == "orphans":  # processes of its own that it never ends: a subprocess and a fork
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        forked = os.fork()
        if forked == 0:
            time.sleep(600)
            os._exit(0)
        ctx.log(orphan_subprocess=sleeper.pid, orphan_fork=forked)
    if fault == "daemons":  # processes that leave its process group: a new session, a double fork
        session = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
        )
        reader, writer = os.pipe()
        if os.fork() == 0:  # the classic daemon: fork, setsid, fork, the middle one leaves
            os.setsid()
            if (grandchild := os.fork()) != 0:
                os.write(writer, str(grandchild).encode())
                os._exit(0)
            time.sleep(600)
            os._exit(0)
        ctx.log(daemon_session=session.pid, daemon_forked=int(os.read(reader, 32)))


def created() -> float:
    """When this process was created (epoch seconds, to the clock tick): unlike a timestamp taken
    in the worker function, it leaves out the imports, whose time varies on a busy machine."""
    stat = Path("/proc/self/stat").read_text()
    ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime: ticks since boot
    lines = Path("/proc/stat").read_text().splitlines()
    boot = next(int(line.split()[1]) for line in lines if line.startswith("btime"))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _faulty(ctx: mprl.Context) -> bool:
    c = ctx.config
    return (
        c.fault != "none"
        and c.fault_rank in (-1, ctx.rank)
        and (c.fault_times == 0 or ctx.restarts < c.fault_times)
    )


class ProbeModel(torch.nn.Module):
    def __init__(self, n_in: int, extra: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(n_in, 2)
        self.extra = torch.nn.ParameterList(
            torch.nn.Parameter(torch.zeros(1)) for _ in range(extra)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class PlayingProbeModel(ProbeModel):
    """A ProbeModel with the ``act`` that ``mprl eval`` and the solved check play with."""

    def __init__(self, n_in: int, extra: int, action: int, returns: str = "list") -> None:
        super().__init__(n_in, extra)
        self.action, self.returns = action, returns

    def act(self, obs: torch.Tensor, deterministic: bool) -> Any:
        if self.returns == "raise":
            raise ValueError("act() is broken")
        actions = [self.action] * obs.shape[0]
        return torch.tensor(actions) if self.returns == "tensor" else actions


def make_model(obs_space, act_space, config):
    n_in = int(np.prod(obs_space.shape))
    if config.play_action < 0:
        return ProbeModel(n_in, config.model_tensors)
    return PlayingProbeModel(n_in, config.model_tensors, config.play_action, config.act_returns)


def make_optimizer(params, config):
    return torch.optim.SGD(params, lr=0.1)


SCHEMA = schema.Schema(
    visits=schema.PerWorker(0),
    envs=schema.PerWorker(""),
    lock=schema.Lock(),
    ready=schema.PerWorker(False),
    seen=schema.Tensor(shape=("workers",)),
)


def probe_worker(ctx: mprl.Context) -> None:
    if ctx.config.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    env = ctx.make_env(0)
    with ctx.state.lock:
        ctx.state.envs[ctx.rank] = type(env.unwrapped).__name__
    ctx.log(
        started=time.time(),
        created=created(),
        seed=ctx.seed,
        threads=torch.get_num_threads(),
        rank=ctx.rank,
        restarts=ctx.restarts,
        pid=os.getpid(),
        tag=ctx.run.of(ProbeOptions).probe_tag,
        step_sleep=ctx.config.step_sleep,
        draws=[random.random(), float(np.random.rand()), float(torch.rand(()))],  # seeded?
    )
    ctx.state.ready[ctx.rank] = True
    # every worker steps, however slowly the others start; should_stop() keeps the heartbeat
    # going meanwhile (a Manager Barrier's wait would be silent)
    while not all(ctx.state.ready) and not ctx.should_stop():
        time.sleep(0.005)  # a worker left asleep here could see the others take the budget
    faulty = _faulty(ctx)
    obs, _ = env.reset()
    ret, length, steps = 0.0, 0, 0
    while not ctx.should_stop():
        at_stop = ctx.config.fault in ("ignore_stop", "raise_at_stop")
        if faulty and steps == ctx.config.fault_at_step and not at_stop:
            inject(ctx, ctx.config.fault)
        action = ctx.config.train_action
        obs, r, term, trunc, _ = env.step(action if action >= 0 else env.action_space.sample())
        ret, length, steps = ret + r, length + 1, steps + 1
        ctx.add_steps(1)
        ctx.state.seen[ctx.rank] += 1
        # one gradient step on the shared model, so tests can see it change
        loss = ctx.model(torch.as_tensor(obs, dtype=torch.float32)).sum()
        ctx.optimizer.zero_grad()
        loss.backward()
        ctx.optimizer.step()
        if term or trunc:
            ctx.log_episode(ret, length)
            ctx.state.visits[ctx.rank] += 1
            ctx.log(env=type(env.unwrapped).__name__, rank=ctx.rank, pid=os.getpid())
            obs, _ = env.reset()
            ret, length = 0.0, 0
        if ctx.config.step_sleep:
            time.sleep(ctx.config.step_sleep)
    if faulty and ctx.config.fault in ("ignore_stop", "raise_at_stop"):
        inject(ctx, ctx.config.fault.replace("_at_stop", ""))


def probe_train(ctx: mprl.Context) -> None:
    if ctx.config.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    cfg = ctx.config
    # (a wait that hands the turn on in a serial run, where a sleep would stall every process)
    if ctx.wait_until(lambda: cfg.trainer_fault != "none" and ctx.env_steps >= cfg.fault_at_step):
        inject(ctx, cfg.trainer_fault)
        ctx.wait_until(lambda: False)  # on until the run stops, as before the fault
    ctx.log(
        trainer_saw_visits=sum(ctx.state.visits),
        trainer_seen=float(ctx.state.seen.sum()),
        tag=ctx.run.of(ProbeOptions).probe_tag,
    )


@mprl.hookimpl
def mprl_register_algorithms(register):
    register(
        mprl.Algorithm(
            name="probe",
            config_cls=ProbeConfig,
            make_model=make_model,
            make_optimizer=make_optimizer,
            worker=probe_worker,
            train=probe_train,
            schema=SCHEMA,
            default_env="Corridor-v0",
            description="test plugin: exercises the Context",
        )
    )
    register(
        mprl.Algorithm(
            name="bursts",
            config_cls=BurstsConfig,
            make_model=make_bursts_model,
            worker=bursts_worker,
            train=bursts_train,
            default_env="Corridor-v0",
            description="test plugin: fast rollouts counted whole (budget tests)",
        )
    )


@attrs.frozen
class BurstsConfig:
    burst: int = attrs.field(default=100, metadata={"help": "env steps counted per rollout"})
    rollout_s: float = attrs.field(default=0.001, metadata={"help": "seconds a rollout takes"})


def bursts_worker(ctx: mprl.Context) -> None:
    """A worker whose rollouts are fast and counted whole: the budget's overshoot at its
    largest, for tests of --total-steps."""
    while not ctx.should_stop():
        time.sleep(ctx.config.rollout_s)
        ctx.add_steps(ctx.config.burst)


def bursts_train(ctx: mprl.Context) -> None:
    while not ctx.should_stop():
        time.sleep(0.01)


def make_bursts_model(obs_space: Any, act_space: Any, config: BurstsConfig) -> torch.nn.Module:
    return torch.nn.Linear(1, 1)


@mprl.hookimpl
def mprl_make_env(env_id):
    if env_id == "Corridor-v0":
        return gym.wrappers.TimeLimit(Corridor(), 50)
    if env_id == "Switches-v0":
        return Switches()
    if env_id == "Rooms-v0":
        return Rooms()
    return None
