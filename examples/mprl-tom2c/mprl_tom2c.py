"""ToM2C, the program mprl grew from, as a third-party mprl plugin: cooperating agents with a
recurrent policy and a theory-of-mind (ToM) head, on Cooperative Navigation
(``--env mpe2:simple_spread_v3``).

Wang et al., ICLR 2022, "ToM2C: Target-oriented Multi-agent Communication and Cooperation with
Theory of Mind". Each agent keeps a GRU over its own observations (reset at an episode's start)
and, for every other agent, a ToM net that infers which landmark that agent is heading for;
its actor chooses from its hidden state and those inferred goals, a centralized critic values
the global state. N workers play whole episodes and hand them over; ONE train process trains
the ToM nets (optimizer ``ToM``: cross-entropy against the landmark each agent is nearest to at
the episode's end) and the policy (optimizer ``Policy``: PPO on the whole episodes), and
publishes the new weights. The seed's Manager control state (``train_modes``, ``n_iters``,
``curr_env_steps``, ``ToM_count`` and the histories) is the schema's, updated once per
iteration.
"""

from __future__ import annotations

import copy
from typing import Any

import attrs
import gymnasium as gym
import numpy as np
import torch
from attrs import validators as v
from torch import nn
from torch.nn import functional as F

import mprl
from mprl import schema
from mprl.errors import ConfigError
from mprl.lib.nets import field_help, mlp
from mprl.lib.norms import ValueNorm
from mprl.spaces import AgentBox, agents_of

__version__ = "0.2.0"

#: ``train_modes`` values: a worker playing its episodes, a worker whose episodes wait for the
#: learner (the seed's ``-10``)
COLLECTING, WAITING = 1, -10


@attrs.frozen
class Config:
    """ToM2C's hyperparameters, sized for Cooperative Navigation on a few CPU cores."""

    envs_per_worker: int = attrs.field(
        default=8,
        validator=v.ge(1),
        metadata=field_help("episodes each worker plays per iteration"),
    )
    max_steps: int = attrs.field(
        default=25,
        validator=v.ge(1),
        metadata=field_help(
            "steps an episode may last (the env's max_cycles); longer ones are cut"
        ),
    )
    landmarks: int = attrs.field(
        default=0,
        validator=v.ge(0),
        metadata=field_help("landmarks in an observation; 0: as many as agents (simple_spread)"),
    )
    hidden: int = attrs.field(
        default=64, validator=v.ge(1), metadata=field_help("GRU and MLP width of the policy")
    )
    tom_hidden: int = attrs.field(
        default=32, validator=v.ge(1), metadata=field_help("GRU width of each ToM net")
    )
    lr: float = attrs.field(default=7e-4, validator=v.gt(0.0), metadata=field_help("Policy lr"))
    tom_lr: float = attrs.field(default=3e-3, validator=v.gt(0.0), metadata=field_help("ToM lr"))
    gamma: float = attrs.field(
        default=0.99, validator=[v.gt(0.0), v.le(1.0)], metadata=field_help("discount factor")
    )
    gae_lambda: float = attrs.field(
        default=0.95, validator=[v.ge(0.0), v.le(1.0)], metadata=field_help("GAE lambda")
    )
    epochs: int = attrs.field(
        default=5, validator=v.ge(1), metadata=field_help("PPO passes over each batch")
    )
    clip: float = attrs.field(
        default=0.2, validator=v.gt(0.0), metadata=field_help("policy ratio clip range")
    )
    entropy_coef: float = attrs.field(
        default=0.01, validator=v.ge(0.0), metadata=field_help("weight of the entropy bonus")
    )
    value_coef: float = attrs.field(
        default=1.0, validator=v.ge(0.0), metadata=field_help("weight of the value loss")
    )
    max_grad_norm: float = attrs.field(
        default=10.0, validator=v.gt(0.0), metadata=field_help("gradient norm clip, per optimizer")
    )
    comm: bool = attrs.field(
        default=True,
        metadata=field_help(
            "the message step: each agent decides whom to send the goal it pursues, and the "
            "received goals enter the others' actors (false: no messages, the ablation)"
        ),
    )
    comm_cost: float = attrs.field(
        default=0.01,
        validator=v.ge(0.0),
        metadata=field_help("reward a sender gives up per message (learning only, not logged)"),
    )
    goal_every: int = attrs.field(
        default=5,
        validator=v.ge(1),
        metadata=field_help(
            "steps an agent keeps the goal it chose before it chooses again (from what it "
            "observes, infers and was last told)"
        ),
    )
    goal_reward: float = attrs.field(
        default=1.0,
        validator=v.ge(0.0),
        metadata=field_help(
            "reward per unit of distance an agent closes to the goal it pursues, less what a "
            "switch of goal adds to it (learning only, not logged): what makes a goal the "
            "target an agent goes for"
        ),
    )


# -- Cooperative Navigation's observation: [own vel (2), own pos (2), landmarks - own pos (2 L),
#    other agents - own pos (2 (A - 1), in agent order without oneself), communication]


def landmarks_of(n_agents: int, config: Config) -> int:
    return config.landmarks or n_agents


def landmark_offsets(obs: torch.Tensor, landmarks: int) -> torch.Tensor:
    """Where each landmark is from the observing agent: ``[..., L, 2]``."""
    return obs[..., 4 : 4 + 2 * landmarks].unflatten(-1, (landmarks, 2))


def other_offsets(obs: torch.Tensor, landmarks: int, others: int) -> torch.Tensor:
    """Where each other agent is from the observing agent: ``[..., A - 1, 2]``."""
    start = 4 + 2 * landmarks
    return obs[..., start : start + 2 * others].unflatten(-1, (others, 2))


def goal_distance(obs: torch.Tensor, goal: torch.Tensor, landmarks: int) -> torch.Tensor:
    """How far each observing agent is from its goal landmark: ``obs [..., F]``, ``goal
    [...]`` -> ``[...]``."""
    dist = landmark_offsets(obs, landmarks).norm(dim=-1)
    return dist.gather(-1, goal.unsqueeze(-1)).squeeze(-1)


def nearest_landmark(obs: torch.Tensor, landmarks: int) -> torch.Tensor:
    """The landmark each observing agent is nearest to: ``obs [..., F]`` -> ``[...]``."""
    return landmark_offsets(obs, landmarks).norm(dim=-1).argmin(-1)


def others_index(n_agents: int) -> torch.Tensor:
    """``[A, A - 1]``: row ``i`` lists the other agents in the order agent ``i`` sees them."""
    return torch.tensor([[j for j in range(n_agents) if j != i] for i in range(n_agents)])


def tom_targets(goals: torch.Tensor) -> torch.Tensor:
    """What each agent's ToM should infer: ``goals [..., A]`` (the landmark each agent went
    for) -> ``[..., A, A - 1]``, the goals of the others as each agent sees them."""
    index = others_index(goals.shape[-1]).to(goals.device)
    return goals[..., index]


def pair_features(obs: torch.Tensor, landmarks: int) -> torch.Tensor:
    """What agent ``i`` observes of each other agent ``j``: ``j``'s offset, the landmarks'
    offsets from ``j`` and their distances: ``obs [..., A, F]`` -> ``[..., A, A - 1, 2 + 3 L]``."""
    others = obs.shape[-2] - 1
    rel = other_offsets(obs, landmarks, others)  # [..., A, P, 2]
    from_j = landmark_offsets(obs, landmarks).unsqueeze(-3) - rel.unsqueeze(-2)  # [.., P, L, 2]
    return torch.cat([rel, from_j.flatten(-2), from_j.norm(dim=-1)], -1)


class ToMNet(nn.Module):
    """Each agent's theory of mind: for every other agent, a GRU over what it observes of
    that agent (and its own hidden state) and a categorical over the landmarks it may be
    heading for."""

    def __init__(self, landmarks: int, hidden: int, tom_hidden: int) -> None:
        super().__init__()
        self.landmarks = landmarks
        self.embed = nn.Sequential(nn.Linear(2 + 3 * landmarks + hidden, tom_hidden), nn.ReLU())
        self.rnn = nn.GRUCell(tom_hidden, tom_hidden)
        self.head = nn.Linear(tom_hidden, landmarks)

    def forward(
        self, obs: torch.Tensor, h: torch.Tensor, g: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``obs [B, A, F]``, the agents' hidden states ``h [B, A, H]`` (not trained through
        here) and the ToM states ``g [B, A, A - 1, G]`` -> goal logits ``[B, A, A - 1, L]`` and
        the new ToM states."""
        pairs = pair_features(obs, self.landmarks)
        own = h.detach().unsqueeze(-2).expand(*pairs.shape[:-1], h.shape[-1])
        x = self.embed(torch.cat([pairs, own], -1))
        g = self.rnn(x.flatten(0, -2), g.flatten(0, -2)).view_as(g)
        return self.head(g), g


@attrs.frozen
class Memory:
    """What an agent carries from one step to the next: its GRU state ``h [B, A, H]``, its
    ToM states ``g [B, A, P, G]``, the goal it pursues ``goal [B, A]`` and what it was last
    told ``heard [B, A, P, 1 + L]`` (:func:`received`). Zeros at an episode's start."""

    h: torch.Tensor
    g: torch.Tensor
    goal: torch.Tensor
    heard: torch.Tensor


@attrs.frozen
class Step:
    """One step of the agents' decisions (``B`` teams of ``A`` agents, ``P = A - 1`` others):
    the logits of the primitive action ``[B, A, n]``, of the goal pursued ``[B, A, L]`` (a
    choice only where ``decided``: else the goal is the one kept), of sending it to each other
    agent ``[B, A, P]`` (``None`` without communication) and of the ToM's goal inferences
    ``[B, A, P, L]``; the goals and sends taken (sampled, or the ones given); and what the
    next step starts from (:class:`Memory`)."""

    logits: torch.Tensor
    goal_logits: torch.Tensor
    send_logits: torch.Tensor | None
    tom_logits: torch.Tensor
    goal: torch.Tensor
    send: torch.Tensor
    decided: bool
    memory: Memory

    def dists(self) -> list[torch.distributions.Distribution]:
        """The action's distributions: primitive move, goal, and (with communication) one
        send-or-not per other agent."""
        out: list[torch.distributions.Distribution] = [
            torch.distributions.Categorical(logits=self.logits),
            torch.distributions.Categorical(logits=self.goal_logits),
        ]
        if self.send_logits is not None:
            out.append(torch.distributions.Bernoulli(logits=self.send_logits))
        return out

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        """Each agent's log-probability ``[B, A]`` of its whole decision: ``action``, the goal
        and the sends taken."""
        move, goal, *send = self.dists()
        logp = move.log_prob(action)
        logp = logp + goal.log_prob(self.goal) if self.decided else logp
        return logp + send[0].log_prob(self.send).sum(-1) if send else logp

    def entropy(self) -> torch.Tensor:
        """Each agent's entropy ``[B, A]`` of its whole decision (the parts are independent)."""
        move, goal, *send = self.dists()
        entropy = move.entropy() + goal.entropy() if self.decided else move.entropy()
        return entropy + send[0].entropy().sum(-1) if send else entropy


def received(send: torch.Tensor, goal: torch.Tensor, landmarks: int) -> torch.Tensor:
    """What each agent receives: ``send [B, A, P]`` (agent ``i`` sends to its ``k``-th other,
    in its order) and ``goal [B, A]`` -> ``[B, A, P, 1 + L]``: for each other agent, in the
    receiver's order, whether it sent, and the goal it sent (one-hot; zeros when it did not)."""
    b, a = goal.shape
    index = others_index(a).to(goal.device).expand(b, a, a - 1)
    to = torch.zeros(b, a, a, device=send.device).scatter(2, index, send)  # [sender, receiver]
    got = to.transpose(1, 2).gather(2, index)  # [receiver, its k-th other]: sent to it
    goals = F.one_hot(goal, landmarks).float()[:, others_index(a).to(goal.device)]
    return torch.cat([got.unsqueeze(-1), got.unsqueeze(-1) * goals], -1)


class ToM2CModel(nn.Module):
    """The agents' shared recurrent actor (a GRU over the agent's observation and one-hot id),
    their ToM nets, and a centralized critic on the global state (one value per agent).

    Each step, in ToM2C's order: the GRU reads the observation; the ToM infers every other
    agent's goal; the agent picks the goal it pursues (a landmark); with communication it
    decides, for each other agent, whether to send it that goal, from its state, what it
    observes of that agent and the goal its ToM infers for it; then its actor picks a move
    from its state, the observation, the inferred goals, its own goal and the goals received.
    An agent chooses its goal every ``goal_every`` steps (from its state, the observation, the
    inferred goals and the goals it was last told) and keeps it between.
    """

    def __init__(self, obs_space: AgentBox, act_space: gym.Space, cfg: Config) -> None:
        super().__init__()
        self.n_agents, features = obs_space.shape
        self.landmarks = landmarks = landmarks_of(self.n_agents, cfg)
        others = self.n_agents - 1
        self.hidden, self.tom_hidden, self.comm = cfg.hidden, cfg.tom_hidden, cfg.comm
        self.encoder = nn.Sequential(nn.Linear(features + self.n_agents, cfg.hidden), nn.ReLU())
        self.rnn = nn.GRUCell(cfg.hidden, cfg.hidden)
        self.tom = ToMNet(landmarks, cfg.hidden, cfg.tom_hidden)
        self.goal_every = cfg.goal_every
        told = others * (1 + landmarks) if cfg.comm else 0  # what it was told (received())
        self.goal_head = mlp(cfg.hidden + features + others * landmarks + told, (cfg.hidden,),
                             landmarks, 0.01)  # fmt: skip
        if cfg.comm:  # whom to send: own state and goal, the pair's features, the ToM's guess
            sender_in = cfg.hidden + 2 * landmarks + 2 + 3 * landmarks
            self.sender = mlp(sender_in, (cfg.hidden,), 1, 0.01)
        n_actions = int(act_space.nvec[0])
        actor_in = cfg.hidden + features + others * landmarks + landmarks
        actor_in += others * (1 + landmarks) if cfg.comm else 0
        self.actor = mlp(actor_in, (cfg.hidden,), n_actions, 0.01)
        state = obs_space.state.shape[0]
        self.critic = mlp(state + self.n_agents, (cfg.hidden, cfg.hidden), 1, 1.0)
        self.register_buffer("eye", torch.eye(self.n_agents))
        self._acting: dict[int, tuple[Memory, int]] = {}  # act()'s, per env: mprl eval
        self.value_norm = ValueNorm()  # the critic learns the returns standardised
        ValueNorm.load_old_moments(self, "ret_moments", "value_norm")  # checkpoints before it

    def policy_parameters(self) -> list[nn.Parameter]:
        """What optimizer ``Policy`` trains: everything but the ToM nets."""
        tom = {id(p) for p in self.tom.parameters()}
        return [p for p in self.parameters() if id(p) not in tom]

    def initial(self, batch: int) -> Memory:
        """What ``batch`` teams start an episode from (zeros)."""
        a, p, device = self.n_agents, self.n_agents - 1, self.eye.device
        return Memory(
            torch.zeros(batch, a, self.hidden, device=device),
            torch.zeros(batch, a, p, self.tom_hidden, device=device),
            torch.zeros(batch, a, dtype=torch.int64, device=device),
            torch.zeros(batch, a, p, 1 + self.landmarks, device=device),
        )

    def step(
        self,
        obs: torch.Tensor,
        memory: Memory,
        t: int,
        goal: torch.Tensor | None = None,
        send: torch.Tensor | None = None,
        greedy: bool = False,
    ) -> Step:
        """Step ``t`` of an episode for ``B`` teams, ``obs [B, A, F]``: the goals (chosen at
        every ``goal_every``-th step, kept between) and the sends are sampled unless given
        (``goal [B, A]``, ``send [B, A, A - 1]``: the ones a worker took, replayed), or with
        ``greedy`` the likeliest taken."""
        b, a = obs.shape[:2]
        x = torch.cat([obs, self.eye.expand(b, -1, -1)], -1)
        h = self.rnn(self.encoder(x).flatten(0, 1), memory.h.flatten(0, 1)).view_as(memory.h)
        tom_logits, g = self.tom(obs, h, memory.g)
        inferred = torch.softmax(tom_logits, -1).detach().flatten(-2)  # [B, A, P * L]
        told = [memory.heard.flatten(-2)] if self.comm else []
        goal_logits = self.goal_head(torch.cat([h, obs, inferred, *told], -1))
        decided = t % self.goal_every == 0
        if goal is None:
            goal = memory.goal
            if decided and greedy:
                goal = goal_logits.argmax(-1)
            elif decided:
                goal = torch.distributions.Categorical(logits=goal_logits).sample()
        own = F.one_hot(goal, self.landmarks).float()
        parts = [h, obs, inferred, own]
        send_logits, heard = None, memory.heard
        if self.comm:
            pairs = pair_features(obs, self.landmarks)
            mine = torch.cat([h, own], -1).unsqueeze(-2).expand(b, a, a - 1, -1)
            guess = inferred.unflatten(-1, (a - 1, self.landmarks))
            send_logits = self.sender(torch.cat([mine, pairs, guess], -1)).squeeze(-1)
            if send is None and greedy:
                send = (send_logits > 0).float()
            elif send is None:
                send = torch.distributions.Bernoulli(logits=send_logits).sample()
            heard = received(send, goal, self.landmarks)
            parts.append(heard.flatten(-2))
        if not self.comm:  # (with it, send was given or sampled above)
            send = torch.zeros(b, a, a - 1, device=obs.device)
        logits = self.actor(torch.cat(parts, -1))
        memory = Memory(h, g, goal, heard)
        return Step(logits, goal_logits, send_logits, tom_logits, goal, send, decided, memory)

    def unroll(
        self, obs: torch.Tensor, goal: torch.Tensor | None = None, send: torch.Tensor | None = None
    ) -> list[Step]:
        """Whole episodes from their start, ``obs [T, B, A, F]``, with the goals ``[T, B, A]``
        and sends ``[T, B, A, A - 1]`` the workers took (sampled where not given): a
        :class:`Step` per time step."""
        memory = self.initial(obs.shape[1])
        steps = []
        for t in range(obs.shape[0]):
            goal_t = None if goal is None else goal[t]
            send_t = None if send is None else send[t]
            step = self.step(obs[t], memory, t, goal_t, send_t)
            steps.append(step)
            memory = step.memory
        return steps

    def begin_episode(self, env: int, playing: bool = True) -> None:
        """For :meth:`act` (``mprl eval``): env ``env`` starts an episode (its agents' memory
        zeroed, its step count 0) or, with ``playing`` false, plays no more."""
        if playing:
            self._acting[env] = (self.initial(1), 0)
        else:
            self._acting.pop(env, None)

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> np.ndarray:
        """Every agent's move for a batch ``obs [B, A, F]`` (``mprl eval``'s contract), each
        env's memory and step count kept here (the rows: the envs playing, by
        :meth:`begin_episode`, in index order; a batch of another size starts afresh). With
        ``deterministic``, the likeliest goal, sends and move."""
        if len(self._acting) != obs.shape[0]:
            self._acting = {j: (self.initial(1), 0) for j in range(obs.shape[0])}
        moves = []
        with torch.no_grad():
            for row, j in enumerate(sorted(self._acting)):
                memory, t = self._acting[j]
                step = self.step(obs[row : row + 1].float(), memory, t, greedy=deterministic)
                self._acting[j] = (step.memory, t + 1)
                if deterministic:
                    moves.append(step.logits.argmax(-1))
                else:
                    moves.append(torch.distributions.Categorical(logits=step.logits).sample())
        return torch.cat(moves).numpy()

    def value(self, state: torch.Tensor) -> torch.Tensor:
        """Each agent's normalised value ``[..., A]`` of the global ``state [..., S]``."""
        x = state.unsqueeze(-2).expand(*state.shape[:-1], self.n_agents, state.shape[-1])
        return self.critic(torch.cat([x, self.eye.expand(*x.shape[:-1], -1)], -1)).squeeze(-1)


def make_model(obs_space: gym.Space, act_space: gym.Space, config: Config) -> nn.Module:
    if agents_of(obs_space) is None or len(obs_space.shape) != 2:
        raise ConfigError(f"tom2c needs a multi-agent env, got {obs_space}")
    n_agents, features = obs_space.shape
    landmarks = landmarks_of(n_agents, config)
    need = 4 + 2 * landmarks + 2 * (n_agents - 1)
    if n_agents < 2 or features < need:
        raise ConfigError(
            f"tom2c reads Cooperative Navigation's observations (own velocity and position, "
            f"{landmarks} landmarks, the other agents: {need} features for {n_agents} agents) "
            f"and needs 2 agents or more; this env has {n_agents} agents of {features} "
            "features (set landmarks=... for another count of landmarks)"
        )
    return ToM2CModel(obs_space, act_space, config)  # type: ignore[arg-type]


def make_policy_optimizer(model: ToM2CModel, config: Config) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.policy_parameters(), lr=config.lr, eps=1e-5)


def make_tom_optimizer(model: ToM2CModel, config: Config) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.tom.parameters(), lr=config.tom_lr)


def rollout_spec(dims: schema.Dims) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """One worker's whole episodes, ``T = max_steps``, ``E = envs_per_worker``: ``obs``
    ``[T + 1, E, A, F]`` and ``state`` ``[T + 1, E, S]`` (row ``length`` the episode's last,
    repeated after it); per agent and step the ``action``, the ``goal`` pursued, the ``send``
    to each other agent ``[T, E, A, A - 1]``, the ``logp`` of all three, the env's ``reward``
    and the learning's ``bonus`` (goal progress less the messages' cost) ``[T, E, A]``;
    ``mask`` ``[T, E]`` (1.0 while the episode runs); per episode ``length`` and ``terminal``
    ``[1, E]``."""
    cfg: Config = dims.config
    t, e = cfg.max_steps, cfg.envs_per_worker
    a, f = dims.observation_space.shape
    return {
        "obs": ((t + 1, e, a, f), torch.float32),
        "state": ((t + 1, e, *dims.observation_space.state.shape), torch.float32),
        "action": ((t, e, a), torch.int64),
        "goal": ((t, e, a), torch.int64),
        "send": ((t, e, a, a - 1), torch.float32),
        "logp": ((t, e, a), torch.float32),
        "reward": ((t, e, a), torch.float32),
        "bonus": ((t, e, a), torch.float32),
        "mask": ((t, e), torch.float32),
        "length": ((1, e), torch.int64),
        "terminal": ((1, e), torch.float32),
    }


SCHEMA = schema.Schema(
    rollouts=schema.Rollouts(rollout_spec, slots_per_worker=1),  # whole episodes, per worker
    weights=schema.Weights(),  # the learner's model, published after each update
    # the seed's control state (Manager objects, changed once per iteration)
    train_modes=schema.PerWorker(COLLECTING),  # COLLECTING, or WAITING for the learner
    n_iters=schema.PerWorker(0),  # batches of episodes each worker handed over
    curr_env_steps=schema.PerWorker(0),  # env steps each worker handed over
    ToM_count=schema.PerWorker(0),  # ToM targets (episodes x agents x others) per worker
    ToM_history=schema.List(),  # the learner's ToM loss, per update
    Policy_history=schema.List(),  # its policy loss, per update
    step_history=schema.List(),  # the run's env steps at each update
    loss_history=schema.List(),  # its total loss (policy + value + ToM), per update
    lock=schema.Lock(),  # the learner's histories change together
)


# -- the workers ---------------------------------------------------------------------------


class Episodes:
    """A worker's envs, each playing one whole episode per iteration into a rollout slot."""

    def __init__(self, ctx: mprl.Context, cfg: Config) -> None:
        self.ctx, self.cfg = ctx, cfg
        self.envs = [ctx.make_env(i) for i in range(cfg.envs_per_worker)]
        space = self.envs[0].observation_space
        self.keys = [f"return_{a}" for a in agents_of(space) or ()]
        self.landmarks = landmarks_of(space.shape[0], cfg)

    def play(self, model: ToM2CModel, slot: dict[str, torch.Tensor]) -> int | None:
        """Fill ``slot`` with one whole episode of each env; the env steps taken, ``None``
        once the run stops."""
        for name in ("reward", "bonus", "mask", "action", "goal", "send", "logp"):
            slot[name].zero_()
        starts = [env.reset() for env in self.envs]
        obs = torch.as_tensor(np.stack([o for o, _ in starts]))
        state = torch.as_tensor(np.stack([i["state"] for _, i in starts]))
        running = np.ones(len(self.envs), bool)
        returns = np.zeros((len(self.envs), obs.shape[1]))
        memory = model.initial(len(self.envs))
        cfg, t = self.cfg, 0
        while running.any() and t < cfg.max_steps:
            if self.ctx.should_stop():
                return None
            slot["obs"][t], slot["state"][t] = obs, state
            with torch.no_grad():
                step = model.step(obs, memory, t)
                actions = torch.distributions.Categorical(logits=step.logits).sample()
                slot["logp"][t] = step.log_prob(actions)
            memory, goal = step.memory, step.goal
            slot["action"][t], slot["goal"][t], slot["send"][t] = actions, goal, step.send
            slot["mask"][t] = torch.as_tensor(running, dtype=torch.float32)
            if t == 0:  # (from the landmark nearest at the start: a far first goal gains nothing)
                before = landmark_offsets(obs, self.landmarks).norm(dim=-1).min(-1).values
            cost = cfg.comm_cost * step.send.sum(-1)
            obs, state = obs.clone(), state.clone()
            for e in np.flatnonzero(running):
                o, _, terminated, truncated, info = self.envs[e].step(actions[e].numpy())
                obs[e], state[e] = torch.as_tensor(o), torch.as_tensor(info["state"])
                slot["reward"][t, e] = torch.as_tensor(info["agent_rewards"])
                returns[e] += info["agent_rewards"]
                if terminated or truncated:
                    running[e] = False
                    slot["terminal"][0, e] = float(terminated)
                    slot["length"][0, e] = t + 1
            # potential-based on (position, goal): the distance closed to the goal, less what
            # a switch of goal added to it, so the bonus of an episode sums to the distance
            # to the nearest landmark at the start less the distance to the goal at the end
            # (running between goals earns nothing)
            after = goal_distance(obs, goal, self.landmarks)
            live = slot["mask"][t].unsqueeze(-1)
            slot["bonus"][t] = (cfg.goal_reward * (before - after) - cost) * live
            before = after
            t += 1
        return self._finish(slot, obs, state, running, returns, t)

    def _finish(
        self, slot: dict[str, torch.Tensor], obs: torch.Tensor, state: torch.Tensor,
        running: np.ndarray, returns: np.ndarray, t: int,
    ) -> int:  # fmt: skip
        """The episodes' last rows, goals and lengths (one cut at ``max_steps`` ends there),
        each one logged; the env steps taken."""
        for e in np.flatnonzero(running):  # cut by max_steps: not terminal
            slot["terminal"][0, e] = 0.0
            slot["length"][0, e] = t
        slot["obs"][t:], slot["state"][t:] = obs, state
        lengths = slot["length"][0].tolist()
        for e, length in enumerate(lengths):
            per_agent = dict(zip(self.keys, returns[e].tolist(), strict=True))
            self.ctx.log_episode(float(returns[e].mean()), length, **per_agent)
        return int(sum(lengths))

    def close(self) -> None:
        for env in self.envs:
            env.close()


def worker(ctx: mprl.Context) -> None:
    """Each iteration: wait for the newest weights, play one whole episode in each env, hand
    the episodes over, and count them in the control state."""
    cfg: Config = ctx.config
    rollouts, weights, state = ctx.state.rollouts, ctx.state.weights, ctx.state
    local: ToM2CModel = copy.deepcopy(ctx.model)  # type: ignore[assignment]
    episodes = Episodes(ctx, cfg)
    pairs = local.n_agents * (local.n_agents - 1)
    while (index := rollouts.acquire()) is not None:
        slot = rollouts.slot(index)
        if weights.wait(int(slot["version"])) is None:
            break
        version = weights.pull(local)
        state.train_modes[ctx.rank] = COLLECTING
        steps = episodes.play(local, slot)
        if steps is None:
            break
        slot["version"].fill_(version)
        ctx.add_steps(steps)
        rollouts.commit(index)
        state.n_iters[ctx.rank] += 1
        state.curr_env_steps[ctx.rank] += steps
        state.ToM_count[ctx.rank] += cfg.envs_per_worker * pairs
        state.train_modes[ctx.rank] = WAITING
    episodes.close()


# -- the learner ---------------------------------------------------------------------------


def advantages(
    reward: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, terminal: torch.Tensor,
    gamma: float, lam: float,
) -> torch.Tensor:  # fmt: skip
    """GAE per agent over whole episodes: ``reward [T, B, A]``, ``value [T + 1, B, A]`` (row
    ``length`` the value where the episode ended), ``mask [T, B]``, ``terminal [B]``. The
    last step of an episode bootstraps from the value where it ended unless it terminated."""
    t_len = reward.shape[0]
    out = torch.zeros_like(reward)
    last = torch.zeros_like(reward[0])
    for t in reversed(range(t_len)):
        following = mask[t + 1] if t + 1 < t_len else torch.zeros_like(mask[t])
        end = mask[t] * (1 - following)  # the episode's last step
        bootstrap = value[t + 1] * (1 - end * terminal).unsqueeze(-1)
        delta = reward[t] + gamma * bootstrap - value[t]
        last = delta + gamma * lam * following.unsqueeze(-1) * last
        out[t] = last * mask[t].unsqueeze(-1)
    return out


def prepare(cfg: Config, model: ToM2CModel, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    """One iteration's episodes, ``[T, W, E, ...]`` -> ``[T, B, ...]``: advantages and value
    targets per agent (of the env's reward plus the bonus), and the ToM targets ``[T, B, A,
    A - 1]``: the goals the others pursued at each step."""
    flat = {k: t.flatten(1, 2) for k, t in batch.items() if t.dim() >= 3}
    with torch.no_grad():
        values = model.value_norm.denormalize(model.value(flat["state"]))  # [T + 1, B, A]
    reward = flat["reward"] + flat["bonus"]
    adv = advantages(reward, values, flat["mask"], flat["terminal"][0], cfg.gamma, cfg.gae_lambda)
    returns = adv + values[:-1]
    live = flat["mask"] > 0
    model.value_norm.update(returns[live])
    adv_live = adv[live]
    adv = (adv - adv_live.mean()) / (adv_live.std() + 1e-8)
    return {
        "obs": flat["obs"][:-1], "state": flat["state"][:-1], "action": flat["action"],
        "goal": flat["goal"], "send": flat["send"], "logp": flat["logp"], "advantage": adv,
        "return": returns, "mask": flat["mask"], "tom_target": tom_targets(flat["goal"]),
    }  # fmt: skip


def tom_terms(
    tom_logits: torch.Tensor, data: dict[str, Any], landmarks: int
) -> tuple[torch.Tensor, float, float]:
    """The ToM loss (cross-entropy over every step, agent and other agent of the episodes,
    against the goal the other agent pursued at that step), its accuracy, and the accuracy of
    guessing each other agent's nearest landmark at that step."""
    mask, target = data["mask"], data["tom_target"]
    weight = mask[..., None, None].expand_as(target)
    ce = F.cross_entropy(tom_logits.flatten(0, -2), target.flatten(), reduction="none")
    loss = (ce * weight.flatten()).sum() / weight.sum()
    hits = (tom_logits.argmax(-1) == target).float()
    accuracy = ((hits * weight).sum() / weight.sum()).item()
    now = tom_targets(nearest_landmark(data["obs"], landmarks))  # [T, B, A, A - 1]
    baseline = ((now == target).float() * weight).sum() / weight.sum()
    return loss, accuracy, baseline.item()


def message_stats(data: dict[str, Any]) -> dict[str, float]:
    """``messages_per_step``: messages sent per team step (all agents); ``message_rate``: the
    fraction of the agent pairs that got one."""
    mask, send = data["mask"], data["send"]
    pairs = send.shape[-2] * send.shape[-1]
    sent = (send.sum((-2, -1)) * mask).sum() / mask.sum().clamp(min=1.0)
    return {"messages_per_step": sent.item(), "message_rate": sent.item() / max(pairs, 1)}


def update(
    cfg: Config, model: ToM2CModel, optimizers: dict[str, torch.optim.Optimizer],
    data: dict[str, Any], should_stop: Any,
) -> dict[str, float]:  # fmt: skip
    """``cfg.epochs`` passes over the whole episodes: PPO for the policy and critic (optimizer
    ``Policy``: each agent's move, goal and sends as one decision) and cross-entropy for the
    ToM nets (optimizer ``ToM``), one gradient step each per pass. Returns the first pass's ToM
    accuracy (before training on these episodes), the messages sent, and the last pass's
    losses."""
    stats: dict[str, float] = message_stats(data)
    mask = data["mask"].unsqueeze(-1).expand_as(data["advantage"])
    denom = mask.sum().clamp(min=1.0)
    targets = model.value_norm(data["return"])
    for epoch in range(cfg.epochs):
        if should_stop():
            break
        steps = model.unroll(data["obs"], data["goal"], data["send"])
        logp = torch.stack([s.log_prob(a) for s, a in zip(steps, data["action"], strict=True)])
        ratio = (logp - data["logp"]).exp()
        a = data["advantage"]
        surrogate = torch.min(ratio * a, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * a)
        policy_loss = -(surrogate * mask).sum() / denom
        entropy = (torch.stack([s.entropy() for s in steps]) * mask).sum() / denom
        error = F.huber_loss(model.value(data["state"]), targets, reduction="none", delta=10.0)
        value_loss = (error * mask).sum() / denom
        tom_logits = torch.stack([s.tom_logits for s in steps])
        tom_loss, accuracy, baseline = tom_terms(tom_logits, data, model.landmarks)
        loss = policy_loss + cfg.value_coef * value_loss - cfg.entropy_coef * entropy
        for opt in optimizers.values():
            opt.zero_grad(set_to_none=True)
        (loss + tom_loss).backward()  # the two never share a gradient: ToM inputs are detached
        nn.utils.clip_grad_norm_(model.policy_parameters(), cfg.max_grad_norm)
        nn.utils.clip_grad_norm_(model.tom.parameters(), cfg.max_grad_norm)
        for opt in optimizers.values():
            opt.step()
        if epoch == 0:
            stats.update(tom_accuracy=accuracy, tom_nearest_now=baseline)
        stats.update(
            policy_loss=policy_loss.item(), value_loss=value_loss.item(),
            entropy=entropy.item(), tom_loss=tom_loss.item(),
            loss=loss.item() + tom_loss.item(),
        )  # fmt: skip
    return stats


def record(ctx: mprl.Context, stats: dict[str, float]) -> None:
    """An update's numbers: the histories (under the lock), the workers released to collect,
    and the metrics (``tom_accuracy`` among them)."""
    state = ctx.state
    with state.lock:
        state.ToM_history.append(stats["tom_loss"])
        state.Policy_history.append(stats["policy_loss"])
        state.step_history.append(ctx.env_steps)
        state.loss_history.append(stats["loss"])
        updates = len(state.loss_history)
    ctx.log(**stats, updates=updates, tom_chance=1.0 / ctx.model.landmarks)


def train(ctx: mprl.Context) -> None:
    """Each iteration: every worker's episodes, the ToM and PPO updates, the new weights
    published (which releases the workers)."""
    cfg: Config = ctx.config
    rollouts, weights = ctx.state.rollouts, ctx.state.weights
    model: ToM2CModel = ctx.model  # type: ignore[assignment]
    optimizers = {"Policy": ctx.optimizers["Policy"], "ToM": ctx.optimizers["ToM"]}
    while (batch := rollouts.take_batch(ctx.n_workers)) is not None:
        data = prepare(cfg, model, ctx.to_device(batch))
        with weights.publishing(model):
            stats = update(cfg, model, optimizers, data, ctx.should_stop)
        if "loss" in stats:
            record(ctx, stats)


@mprl.hookimpl
def mprl_register_algorithms(register):
    register(
        mprl.Algorithm(
            name="tom2c",
            config_cls=Config,
            make_model=make_model,
            optimizers={"Policy": make_policy_optimizer, "ToM": make_tom_optimizer},
            worker=worker,
            train=train,
            schema=SCHEMA,
            agents="multi",
            action_spaces=(gym.spaces.MultiDiscrete,),
            default_env="mpe2:simple_spread_v3",
            description="ToM2C: recurrent agents with a theory-of-mind head, PPO, two optimizers",
        )
    )
