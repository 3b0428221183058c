"""A plugin of the classic program's shape for the Ray backend's tests (see tests/slow/ray_cluster).

Algorithm ``relay``: workers meet at a Barrier, play CartPole with ``ctx.model`` and put whole
episodes on a Queue; the train process takes them, counts updates in a Value and a List
changed together under a Lock, and marks the model (``marker`` = its update count), so a test
can see that workers on other nodes act with the train process's model. Faults on request, like
the probe plugin's: ``--set fault=raise|sigkill|hang`` at a worker's ``fault_at_step``.

Algorithm ``versions``: the learner publishes its model through a ``Weights`` field every few
milliseconds, each version marked (``marker`` = the version, one Adam step per version); each
worker pulls into ``ctx.model`` itself now and then and counts the steps it acted with a model
whose marker is not the version it pulled (``wrong``): the driver must not load anything else
into a worker's ``ctx.model`` (a plugin with ``Weights`` gets no model relayed). With
``learn_s``, the learner returns (ending the run) once it learnt that long and every worker
acted ``until_checked`` steps with a published version.

Algorithm ``pixels``: each worker commits rollouts of Atari-shaped uint8 frames (8 steps of 4
envs, 4 stacked 84x84 frames: 900 KB), every byte a function of its rank, the rollout's number
and its position; the learner checks every byte and the dtype of each batch it takes
(``good``/``bad`` per rank) and weighs the frames of each commit that came to the hub as a call
(``call_bytes``), to show which commits were calls: none from a worker that maps the hub's
memory. (Ray moves a call's arguments past 100 KB through its object store by itself.)
"""

from __future__ import annotations

import os
import signal
import threading
import time

import attrs
import numpy as np
import torch

import mprl
from mprl import schema


@attrs.frozen
class RelayConfig:
    fault: str = attrs.field(default="none", metadata={"help": "none, raise, sigkill, hang"})
    fault_rank: int = attrs.field(default=0, metadata={"help": "the worker with the fault"})
    fault_at_step: int = attrs.field(default=200, metadata={"help": "its step of the fault"})
    fault_times: int = attrs.field(default=1, metadata={"help": "incarnations with the fault"})
    step_sleep: float = attrs.field(default=0.0, metadata={"help": "seconds per step"})
    wait_for_model: bool = attrs.field(
        default=False,
        metadata={"help": "count steps only once the worker acts with an updated model"},
    )


class Marked(torch.nn.Module):
    def __init__(self, n_obs: int, n_act: int) -> None:
        super().__init__()
        self.policy = torch.nn.Linear(n_obs, n_act)
        self.marker = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.policy(x)


SCHEMA = schema.Schema(
    episodes=schema.Queue(maxsize=64),
    steps=schema.PerWorker(0),  # env steps each worker put on the queue
    met=schema.PerWorker(False),  # passed the barrier
    saw=schema.PerWorker(0.0),  # the largest model marker each worker acted with
    losses=schema.List(),
    updates=schema.Value("i", 0),
    lock=schema.Lock(),
    gate=schema.Barrier(),
)


def make_model(obs_space, act_space, config):
    return Marked(int(np.prod(obs_space.shape)), int(act_space.n))


def make_optimizer(params, config):
    return torch.optim.SGD(params, lr=0.01)


def _fault(ctx: mprl.Context) -> None:
    fault = ctx.config.fault
    if fault == "raise":
        raise RuntimeError(f"injected failure in {ctx.source}")
    if fault == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "hang":
        threading.Event().wait(3600)  # no heartbeat from here on


@attrs.frozen
class RelayOptions:
    relay_tag: str = attrs.field(default="", metadata={"help": "a tag every process logs back"})


@mprl.hookimpl
def mprl_register_options(register):
    register(RelayOptions)


def worker(ctx: mprl.Context) -> None:
    cfg: RelayConfig = ctx.config
    env = ctx.make_env()
    state = ctx.state
    ctx.log(tag=ctx.run.of(RelayOptions).relay_tag, step_sleep=cfg.step_sleep)
    if ctx.restarts == 0:
        state.gate.wait(timeout=120)  # every worker of the first start meets here
    state.met[ctx.rank] = True
    faulty = cfg.fault != "none" and ctx.rank == cfg.fault_rank and ctx.restarts < cfg.fault_times
    steps, saw = 0, 0.0
    while not ctx.should_stop():
        obs, _ = env.reset()
        done, length, ret = False, 0, 0.0
        while not done:
            if faulty and steps == cfg.fault_at_step:
                _fault(ctx)
            with torch.no_grad():
                logits = ctx.model(torch.as_tensor(obs, dtype=torch.float32))
                saw = max(saw, float(ctx.model.marker))
            action = int(torch.distributions.Categorical(logits=logits).sample())
            obs, reward, term, trunc, _ = env.step(action)
            done, length, ret, steps = term or trunc, length + 1, ret + float(reward), steps + 1
            if saw > 0 or not cfg.wait_for_model:  # the handshake: no end before a synced model
                ctx.add_steps(1)
            if cfg.step_sleep:
                time.sleep(cfg.step_sleep)
        ctx.log_episode(ret, length)
        state.steps[ctx.rank] += length
        state.saw[ctx.rank] = saw
        if not ctx.put(state.episodes, (ctx.rank, length)):
            return


def train(ctx: mprl.Context) -> None:
    state, model = ctx.state, ctx.model
    ctx.log(tag=ctx.run.of(RelayOptions).relay_tag)
    while (episode := ctx.get(state.episodes)) is not None:
        _, length = episode
        loss = model(torch.zeros(1, model.policy.in_features)).sum() * 0.0
        ctx.optimizer.zero_grad()
        loss.backward()
        ctx.optimizer.step()
        with state.lock:  # the list and the count change together
            state.losses.append(length)
            state.updates.value += 1
            n = state.updates.value
        with torch.no_grad():
            model.marker.fill_(float(n))


@attrs.frozen
class VersionsConfig:
    pull_every: int = attrs.field(default=50, metadata={"help": "worker steps between pulls"})
    publish_sleep: float = attrs.field(default=0.002, metadata={"help": "seconds per update"})
    # the learner returns (the run ends) once it has learnt this long and every worker acted
    # this many steps with a published version: a loaded machine starts later, not less
    learn_s: float = attrs.field(default=0.0, metadata={"help": "0: until the run stops"})
    until_checked: int = attrs.field(default=0, metadata={"help": "0: no such end"})


VERSIONS = schema.Schema(
    weights=schema.Weights(),
    pulled=schema.PerWorker(0),  # the newest version each worker pulled
    checked=schema.PerWorker(0),  # steps acted with a pulled version (> 0)
    wrong=schema.PerWorker(0),  # steps acted with a marker that is not the version pulled
)


def make_adam(params, config):
    return torch.optim.Adam(params, lr=1e-3)


def versions_worker(ctx: mprl.Context) -> None:
    cfg: VersionsConfig = ctx.config
    env, state, model = ctx.make_env(), ctx.state, ctx.model
    version, checked, wrong, steps = -1, 0, 0, 0
    env.reset(seed=ctx.seed)
    while not ctx.should_stop():
        if steps % cfg.pull_every == 0:
            version = state.weights.pull(model, version)
        marker = float(model.marker)
        if version > 0:
            checked += 1
            wrong += marker != float(version)
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            env.reset()
            state.pulled[ctx.rank], state.checked[ctx.rank] = version, checked
            state.wrong[ctx.rank] = wrong
        steps += 1
        ctx.add_steps(1)
    state.pulled[ctx.rank], state.checked[ctx.rank], state.wrong[ctx.rank] = version, checked, wrong


def versions_train(ctx: mprl.Context) -> None:
    cfg: VersionsConfig = ctx.config
    model, weights, optimizer = ctx.model, ctx.state.weights, ctx.optimizer
    start = looked = time.monotonic()
    while not ctx.should_stop():
        if cfg.learn_s and time.monotonic() - looked >= 0.5:  # a Manager read twice a second
            looked = time.monotonic()
            if looked - start >= cfg.learn_s and min(ctx.state.checked) >= cfg.until_checked:
                return
        with weights.publishing(model):  # one Adam step and the marker: one version
            optimizer.zero_grad()
            model.policy(torch.ones(1, model.policy.in_features)).sum().backward()
            optimizer.step()
            with torch.no_grad():
                model.marker.fill_(float(weights.version + 1))
        time.sleep(cfg.publish_sleep)


PIXELS = 8, 4, 4, 84, 84  # unroll, envs, stacked frames, height, width: 903,168 bytes


def _frames(rank: int, number: int) -> torch.Tensor:
    """The frames of ``rank``'s rollout ``number``: every byte depends on both and its place."""
    flat = torch.arange(int(np.prod(PIXELS)), dtype=torch.int64)
    return ((flat * (2 * rank + 3) + 7 * number) % 251).to(torch.uint8).reshape(PIXELS)


@attrs.frozen
class PixelsConfig:
    pass


PIXELS_SCHEMA = schema.Schema(
    frames=schema.Rollouts({"obs": (PIXELS, torch.uint8), "number": ((), torch.int64)}),
    good=schema.PerWorker(0),  # rollouts of each rank whose every byte the learner checked
    bad=schema.PerWorker(0),  # rollouts of each rank with a wrong byte or dtype
    call_bytes=schema.List(),  # the frames' pickled size of each commit that came as a call
)


def pixels_worker(ctx: mprl.Context) -> None:
    frames, number = ctx.state.frames, 0
    while (index := frames.acquire(timeout=None)) is not None:
        slot = frames.slot(index)
        slot["obs"].copy_(_frames(ctx.rank, number))
        slot["number"].fill_(number)
        frames.commit(index)
        number += 1
        ctx.add_steps(PIXELS[0] * PIXELS[1])


def pixels_train(ctx: mprl.Context) -> None:
    import pickle

    from mprl.transport.hub import Hub

    state, sizes = ctx.state, []
    put = Hub.put

    def weighed_put(hub, field, rank, data, have):  # a commit that came as a call
        sizes.append(sum(len(pickle.dumps(v)) for v in data.values()))
        return put(hub, field, rank, data, have)

    Hub.put = weighed_put  # the hub lives in this process
    while (batch := state.frames.take_batch(1, timeout=None)) is not None:
        rank, number = int(batch["source"][0]), int(batch["number"][0])
        obs = batch["obs"][:, 0]
        ok = obs.dtype == torch.uint8 and torch.equal(obs, _frames(rank, number))
        if ok:
            state.good[rank] += 1
        else:
            state.bad[rank] += 1
        if sizes:
            state.call_bytes.extend(sizes)
            sizes.clear()


@mprl.hookimpl
def mprl_register_algorithms(register):
    register(
        mprl.Algorithm(
            name="pixels",
            config_cls=PixelsConfig,
            make_model=make_model,
            worker=pixels_worker,
            train=pixels_train,
            schema=PIXELS_SCHEMA,
            default_env="CartPole-v1",
            description="test plugin: uint8 frames through rollout slots, every byte checked",
        )
    )
    register(
        mprl.Algorithm(
            name="versions",
            config_cls=VersionsConfig,
            make_model=make_model,
            make_optimizer=make_adam,
            worker=versions_worker,
            train=versions_train,
            schema=VERSIONS,
            default_env="CartPole-v1",
            description="test plugin: weights through a Weights field, checked by the workers",
        )
    )
    register(
        mprl.Algorithm(
            name="relay",
            config_cls=RelayConfig,
            make_model=make_model,
            make_optimizer=make_optimizer,
            worker=worker,
            train=train,
            schema=SCHEMA,
            default_env="CartPole-v1",
            description="test plugin: the classic program's shape, for the Ray backend",
        )
    )
