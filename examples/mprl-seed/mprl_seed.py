"""The classic multi-process RL program as an mprl plugin: workers play whole episodes and put
them on a Queue, ONE train process learns from batches of them (REINFORCE) on the shared model;
the hand-written main's control state (step counts, losses, a lock, an event) is the schema."""

from __future__ import annotations

import attrs
import gymnasium as gym
import numpy as np
import torch
from torch import nn

import mprl
from mprl import schema


@attrs.frozen
class Config:
    lr: float = attrs.field(default=0.01, metadata={"help": "Adam step size"})
    gamma: float = attrs.field(default=0.99, metadata={"help": "discount"})
    batch_episodes: int = attrs.field(default=8, metadata={"help": "episodes per update"})
    hidden: int = attrs.field(default=64, metadata={"help": "hidden units"})


SCHEMA = schema.Schema(
    episodes=schema.Queue(maxsize=32),  # whole episodes, workers -> learner
    steps=schema.PerWorker(0),  # env steps per worker
    loss_history=schema.List(),  # the learner's losses
    n_iters=schema.Value("i", 0),  # the learner's updates
    lock=schema.Lock(),  # loss_history and n_iters change together
    ready=schema.Event(),  # set once the learner waits for episodes
)


def make_model(obs_space: gym.Space, act_space: gym.Space, config: Config) -> nn.Module:
    n_obs = int(np.prod(obs_space.shape))
    return nn.Sequential(
        nn.Linear(n_obs, config.hidden), nn.Tanh(), nn.Linear(config.hidden, act_space.n)
    )


def make_optimizer(params, config: Config) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=config.lr)


def play(model: nn.Module, env: gym.Env) -> tuple[np.ndarray, list[int], list[float]]:
    obs, _ = env.reset()
    observations, actions, rewards, done = [], [], [], False
    while not done:
        with torch.no_grad():
            logits = model(torch.as_tensor(obs, dtype=torch.float32))
        action = int(torch.distributions.Categorical(logits=logits).sample())
        observations.append(obs)
        obs, reward, terminated, truncated, _ = env.step(action)
        actions.append(action)
        rewards.append(float(reward))
        done = terminated or truncated
    return np.array(observations, dtype=np.float32), actions, rewards


def worker(ctx: mprl.Context) -> None:
    env = ctx.make_env()
    if not ctx.wait(ctx.state.ready):  # False: the run stopped first
        return
    while not ctx.should_stop():
        episode = play(ctx.model, env)
        rewards = episode[2]
        ctx.add_steps(len(rewards))
        ctx.log_episode(sum(rewards), len(rewards))
        ctx.state.steps[ctx.rank] += len(rewards)  # a Manager round trip per episode
        if not ctx.put(ctx.state.episodes, episode):  # False: the run stopped first
            return


def returns_of(rewards: list[float], gamma: float) -> torch.Tensor:
    out, running = [], 0.0
    for reward in reversed(rewards):
        running = reward + gamma * running
        out.append(running)
    return torch.tensor(out[::-1])


def train(ctx: mprl.Context) -> None:
    cfg: Config = ctx.config
    optimizer = ctx.optimizer
    ctx.state.ready.set()
    while True:
        batch = [ctx.get(ctx.state.episodes) for _ in range(cfg.batch_episodes)]
        if any(episode is None for episode in batch):  # None: the run stops
            return
        obs = torch.as_tensor(np.concatenate([e[0] for e in batch]))
        actions = torch.as_tensor([a for e in batch for a in e[1]])
        returns = torch.cat([returns_of(e[2], cfg.gamma) for e in batch])
        returns = (returns - returns.mean()) / (returns.std() + 1e-8)
        logp = torch.log_softmax(ctx.model(obs), -1).gather(1, actions[:, None]).squeeze(1)
        loss = -(logp * returns).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()  # the shared model: the workers play the new policy at once
        with ctx.state.lock:
            ctx.state.loss_history.append(loss.item())
            ctx.state.n_iters.value += 1
        ctx.log(loss=loss.item(), n_iters=ctx.state.n_iters.value)


@mprl.hookimpl
def mprl_register_algorithms(register):
    register(
        mprl.Algorithm(
            name="seed",
            config_cls=Config,
            make_model=make_model,
            make_optimizer=make_optimizer,
            worker=worker,
            train=train,
            schema=SCHEMA,
            action_spaces=(gym.spaces.Discrete,),
            description="the classic program: episodes on a Queue, one REINFORCE learner",
        )
    )
