"""A small DQN: the off-policy shape, written against the schema's transport only.

Workers act epsilon-greedily with their copy of the newest published Q network and add every
transition to the replay buffer; one learner samples it, keeps a target network in the shared
state (checkpointed), counts its updates in a shared counter and publishes its weights.
"""

from __future__ import annotations

import copy
import random
import time

import attrs
import gymnasium as gym
import torch
from torch import nn

import mprl
from mprl import schema


@attrs.frozen
class DQNConfig:
    lr: float = attrs.field(default=1e-3, metadata={"help": "Adam step size"})
    gamma: float = attrs.field(default=0.99, metadata={"help": "discount"})
    buffer_size: int = attrs.field(default=20_000, metadata={"help": "replay capacity (rows)"})
    batch_size: int = attrs.field(default=64, metadata={"help": "rows per update"})
    learning_starts: int = attrs.field(default=500, metadata={"help": "rows before learning"})
    target_every: int = attrs.field(default=200, metadata={"help": "updates per target copy"})
    eps_steps: int = attrs.field(default=10_000, metadata={"help": "env steps of exploration"})
    hidden: int = attrs.field(default=64, metadata={"help": "hidden units"})
    steps_per_update: int = attrs.field(
        default=4, metadata={"help": "env steps the workers may take per learner update"}
    )


SCHEMA = schema.Schema(
    replay=schema.ReplayBuffer(capacity="config.buffer_size"),  # rows shaped by the spaces
    weights=schema.Weights(),
    target=schema.Module(),  # a copy of the model: the learner's target network
    updates=schema.Counter(),
)


def make_model(obs_space: gym.Space, act_space: gym.Space, config: DQNConfig) -> nn.Module:
    return nn.Sequential(
        nn.Linear(obs_space.shape[0], config.hidden),
        nn.ReLU(),
        nn.Linear(config.hidden, act_space.n),
    )


def make_optimizer(params, config: DQNConfig) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=config.lr)


def worker(ctx: mprl.Context) -> None:
    cfg: DQNConfig = ctx.config
    env, local, version = ctx.make_env(), copy.deepcopy(ctx.model), -1
    replay, weights, updates = ctx.state.replay, ctx.state.weights, ctx.state.updates
    obs, _ = env.reset()
    episode_return, length = 0.0, 0
    while not ctx.should_stop():
        if ctx.env_steps >= cfg.learning_starts + cfg.steps_per_update * updates.value:
            time.sleep(0.001)  # ahead of the learner: the replay ratio stays bounded
            continue
        version = weights.pull(local, version)
        eps = max(0.05, 1.0 - ctx.env_steps / cfg.eps_steps)
        if random.random() < eps:
            action = int(env.action_space.sample())
        else:
            with torch.no_grad():
                action = int(local(torch.as_tensor(obs, dtype=torch.float32)).argmax())
        nxt, reward, terminated, truncated, _ = env.step(action)
        replay.add(
            obs=torch.as_tensor(obs)[None], action=torch.tensor([action]),
            reward=torch.tensor([reward]), next_obs=torch.as_tensor(nxt)[None],
            done=torch.tensor([float(terminated)]),
        )  # fmt: skip
        ctx.add_steps(1)
        episode_return, length, obs = episode_return + float(reward), length + 1, nxt
        if terminated or truncated:
            ctx.log_episode(episode_return, length)
            (obs, _), episode_return, length = env.reset(), 0.0, 0


def train(ctx: mprl.Context) -> None:
    cfg: DQNConfig = ctx.config
    replay, weights, target, updates = (
        ctx.state.replay, ctx.state.weights, ctx.state.target, ctx.state.updates,
    )  # fmt: skip
    model, optimizer = ctx.model, ctx.optimizer
    generator = torch.Generator().manual_seed(ctx.seed)
    while not ctx.should_stop():
        if replay.size() < cfg.learning_starts:
            time.sleep(0.001)
            continue
        batch = replay.sample(cfg.batch_size, generator)
        q = model(batch["obs"]).gather(1, batch["action"][:, None]).squeeze(1)
        with torch.no_grad():
            best = target(batch["next_obs"]).max(1).values
            wanted = batch["reward"] + cfg.gamma * (1.0 - batch["done"]) * best
        loss = nn.functional.smooth_l1_loss(q, wanted)
        optimizer.zero_grad()
        loss.backward()
        with weights.publishing(model):
            optimizer.step()
        updates.add(1)
        if updates.value % cfg.target_every == 0:
            target.load_state_dict(model.state_dict())
            ctx.log(loss=loss.item(), updates=updates.value, replay_rows=replay.size())


@mprl.hookimpl
def mprl_register_algorithms(register):
    register(
        mprl.Algorithm(
            name="docs-dqn",
            config_cls=DQNConfig,
            make_model=make_model,
            make_optimizer=make_optimizer,
            worker=worker,
            train=train,
            schema=SCHEMA,
            action_spaces=(gym.spaces.Discrete,),
            description="DQN: workers fill a replay buffer, one learner with a target network",
        )
    )
