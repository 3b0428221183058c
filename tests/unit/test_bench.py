"""mprl.testing.Bench: one worker or the train process called by the test itself, over a serial
state; the mprl_state fixture's arguments; SharedState.bound and trainer_slot."""

from __future__ import annotations

import pickle
import sys
import types
from pathlib import Path

import attrs
import pytest
import torch

import mprl
from mprl import schema, testing
from mprl.backends import child
from mprl.backends.child import DeviceLearner
from mprl.errors import ConfigError, SchemaError
from mprl.testing import Bench
from tests.conftest import REPO
from tests.plugins import mprl_docs_dqn
from tests.unit.test_first_plugin_guide import code_blocks

DQN = testing.registered(mprl_docs_dqn)["docs-dqn"]
SMALL = {"buffer_size": 1000, "learning_starts": 200, "batch_size": 16}


@attrs.frozen
class HogwildConfig:
    lr: float = 0.01


def make_model(obs_space, act_space, config):
    return torch.nn.Linear(obs_space.shape[0], act_space.n)


def make_optimizer(params, config):
    return torch.optim.SGD(params, lr=config.lr)


def hogwild_worker(ctx: mprl.Context) -> None:
    """Play an episode, step the shared optimizer, report; until stopped (a Hogwild worker)."""
    env = ctx.make_env()
    while not ctx.should_stop():
        obs, _ = env.reset()
        done, length, log_probs = False, 0, []
        while not done:
            dist = torch.distributions.Categorical(logits=ctx.model(torch.as_tensor(obs)))
            action = dist.sample()
            log_probs.append(dist.log_prob(action))
            obs, _, terminated, truncated, _ = env.step(action.item())
            done, length = terminated or truncated, length + 1
        loss = -torch.stack(log_probs).sum()
        ctx.optimizer.zero_grad()
        loss.backward()
        ctx.optimizer.step()
        ctx.add_steps(length)
        ctx.log_episode(float(length), length, loss=loss.item())
        ctx.state.episodes[ctx.rank] += 1


HOGWILD = mprl.Algorithm(
    name="hogwild",
    config_cls=HogwildConfig,
    make_model=make_model,
    make_optimizer=make_optimizer,
    worker=hogwild_worker,
    schema=schema.Schema(episodes=schema.PerWorker(0)),
)


def test_a_worker_called_by_the_test_writes_its_steps_into_the_shared_state():
    bench = Bench(DQN, workers=2, config=SMALL)
    ctx = bench.context(1, steps=150)
    assert (ctx.role, ctx.rank, ctx.n_workers, ctx.source) == ("worker", 1, 2, "worker:1")
    mprl_docs_dqn.worker(ctx)  # returns: its stop came after 150 env steps
    assert bench.env_steps == ctx.env_steps == 150
    assert bench.state.replay.size() == 150
    rows = bench.state.bound(0).replay.sample(32, torch.Generator().manual_seed(0))
    assert rows["obs"].shape == (32, 4) and set(rows["action"].tolist()) <= {0, 1}
    assert bench.episode_returns and all(r["source"] == "worker:1" for r in bench.records)
    assert sum(r["episode_length"] for r in bench.records) <= 150


def test_the_train_process_learns_from_what_a_worker_left():
    bench = Bench(DQN, workers=1, config=SMALL)
    mprl_docs_dqn.worker(bench.context(0, steps=200))
    before = [p.detach().clone() for p in bench.model.parameters()]
    trainer = bench.context("trainer", stop_when=lambda ctx: ctx.state.updates.value >= 5)
    assert (trainer.role, trainer.rank, trainer.source) == ("trainer", -1, "trainer")
    mprl_docs_dqn.train(trainer)
    assert bench.state.updates.value == 5
    assert bench.state.weights.version == 5  # each update published
    after = list(bench.model.parameters())  # the contexts' models write to the bench's
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))


def test_a_hogwild_worker_trains_the_shared_model_and_logs_its_episodes():
    bench = Bench(HOGWILD, workers=2)
    before = [p.detach().clone() for p in bench.model.parameters()]
    ctx = bench.context(0, stop_after=3)  # three episodes: three stop checks answered false
    hogwild_worker(ctx)
    assert len(bench.episode_returns) == 3 == bench.state.episodes[0]
    assert list(bench.state.episodes) == [3, 0]
    assert bench.env_steps == sum(r["episode_length"] for r in bench.records)
    assert not torch.equal(next(bench.model.parameters()), before[0])
    assert all("loss" in r for r in bench.records)


def test_a_context_is_seeded_as_its_process_would_be():
    bench = Bench(DQN, workers=2, seed=5)
    first = (bench.context(0).seed, torch.rand(3))
    again = (Bench(DQN, workers=2, seed=5).context(0).seed, torch.rand(3))
    other = bench.context(1).seed
    assert first[0] == again[0] != other
    assert torch.equal(first[1], again[1])  # torch drew from the context's seed


def test_stop_rules_and_stop():
    bench = Bench(DQN, workers=2)
    ctx = bench.context(0, stop_after=2)
    assert [ctx.should_stop() for _ in range(4)] == [False, False, True, True]  # for good
    ctx = bench.context(1, steps=3)
    ctx.add_steps(2)
    assert not ctx.should_stop()
    ctx.add_steps(1)
    assert ctx.should_stop()
    calls = []
    ctx = bench.context(0, stop_when=lambda c: calls.append(c) or len(calls) > 1)
    assert [ctx.should_stop(), ctx.should_stop()] == [False, True] and calls[0] is ctx
    ctx = bench.context(1)
    assert not ctx.should_stop()
    bench.stop()
    assert ctx.should_stop() and bench.context(0).should_stop()


def test_a_context_that_never_stops_fails_the_test_instead_of_hanging_it():
    ctx = Bench(DQN).context(0, timeout=0.05)
    with pytest.raises(TimeoutError, match=r"worker 0 has not stopped after 0.05 s; give"):
        while not ctx.should_stop():
            ctx.add_steps(1)


def test_what_a_bench_refuses():
    with pytest.raises(ConfigError, match="field 'lr'"):
        Bench(DQN, config={"lr": "fast"})
    bench = Bench(DQN, workers=2)
    for rank in (2, -2, "worker", True):
        with pytest.raises(ValueError, match=r"a worker's rank is 0 .. 1"):
            bench.context(rank)
    with pytest.raises(ValueError, match="'hogwild' has no train function"):
        Bench(HOGWILD).context("trainer")


def test_a_bench_of_an_algorithm_by_name_through_the_fixture(mprl_pm, mprl_bench):
    mprl_pm.register(mprl_docs_dqn)
    bench = mprl_bench("docs-dqn", workers=1, config={"buffer_size": 64})
    assert bench.config.buffer_size == 64 and bench.run.workers == 1
    mprl_docs_dqn.worker(bench.context(0, steps=10))
    assert bench.state.replay.size() == 10
    # the same algorithm object too: it is the one the plugin manager has
    assert mprl_bench(DQN).algorithm == DQN


def test_the_train_process_on_a_device_gets_copies_but_not_the_modules_of_the_state(
    monkeypatch,
):
    # the child runtime moves the train process's model and optimizers to --device; a schema
    # Module stays where the backend built it (shared CPU memory), on every backend
    class CpuLearner(DeviceLearner):
        def __init__(self, model, optimizers, device):
            super().__init__(model, optimizers, torch.device("cpu"))

    monkeypatch.setattr(child, "resolve_device", lambda spec, *a: torch.device("cuda"))
    monkeypatch.setattr(child, "DeviceLearner", CpuLearner)
    bench = Bench(DQN, workers=1)
    trainer = bench.context("trainer")
    worker = bench.context(0)
    assert trainer.state.target is bench.state.target is worker.state.target
    model_params = {p.data_ptr() for p in bench.model.parameters()}
    assert not {p.data_ptr() for p in trainer.model.parameters()} & model_params  # a copy
    assert {p.data_ptr() for p in worker.model.parameters()} == model_params


def test_mprl_state_takes_what_build_state_takes(mprl_state, mprl_pm):
    state = mprl_state(DQN, workers=3, config={"buffer_size": 300}, env="CartPole-v1")
    assert state.replay.capacity == 300 and state.trainer_slot == 3
    bare = schema.Schema(q=schema.Queue("config.queue_size"), rows=schema.Tensor(("workers", 2)))
    state = mprl_state(bare, 2, config={"queue_size": 4}, plugins=mprl_pm)
    assert state.q.maxsize == 4 and state.rows.shape == (2, 2)


def test_bound_takes_a_rank_or_the_trainer_slot():
    state = testing.build_state(schema.Schema(updates=schema.Counter(), n=schema.PerWorker(0)), 3)
    assert state.trainer_slot == 3
    state.bound("trainer").updates.add(2)
    state.bound(state.trainer_slot).updates.add(1)
    state.bound(0).updates.add(4)
    assert state.updates.value == 7
    assert state.bound(1).n is state.n  # Manager kinds are shared as they are
    with pytest.raises(ValueError, match="a worker's rank, or 'trainer'"):
        state.bound(-1)
    copy = pickle.loads(pickle.dumps(state))  # the worker count travels with it
    assert copy.trainer_slot == 3 and sorted(vars(copy)) == ["n", "updates"]
    with pytest.raises(SchemaError, match="'trainer_slot': the name of a SharedState member"):
        schema.Schema(trainer_slot=schema.Counter())


def test_the_whole_plugin_and_its_bench_test_on_the_plugins_page_work(
    mprl_pm, mprl_bench, monkeypatch
):
    blocks = [b.code for b in code_blocks((REPO / "docs" / "plugins.md").read_text())]
    (plugin,) = [b for b in blocks if b.startswith("# my_algo.py")]
    (test,) = [b for b in blocks if "mprl_bench(" in b]
    my_algo = types.ModuleType("my_algo")
    monkeypatch.setitem(sys.modules, "my_algo", my_algo)
    exec(compile(plugin, "my_algo.py", "exec"), my_algo.__dict__)
    page: dict[str, object] = {"my_algo": my_algo}
    exec(compile(test, "plugins.md", "exec"), page)
    page["test_my_worker_counts_its_episodes"](mprl_pm, mprl_bench)


def test_the_bench_and_its_fixture_are_documented():
    reference = (REPO / "docs" / "reference.md").read_text()
    for name in ("Bench(", "mprl_bench", "bench.context(", "state.bound(", "trainer_slot"):
        assert name in reference, name
    assert "mprl_bench" in Path(testing.__file__).read_text().split('"""')[1]
    assert mprl.Context  # the contexts are the public Context


def paced_worker(ctx: mprl.Context) -> None:
    """A row a step into a replay buffer at a declared ratio, until stopped."""
    env = ctx.make_env()
    obs, _ = env.reset()
    while not ctx.should_stop():
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        ctx.state.replay.add(
            obs=torch.as_tensor(obs).unsqueeze(0),
            action=torch.tensor([action]),
            reward=torch.tensor([float(reward)]),
            next_obs=torch.as_tensor(next_obs).unsqueeze(0),
            done=torch.tensor([float(terminated)]),
        )
        ctx.add_steps(1)
        obs = env.reset()[0] if terminated or truncated else next_obs


def paced_train(ctx: mprl.Context) -> None:
    while ctx.state.replay.sample(8) is not None:
        pass


PACED = mprl.Algorithm(
    name="paced",
    config_cls=HogwildConfig,
    make_model=make_model,
    worker=paced_worker,
    train=paced_train,
    schema=schema.Schema(
        replay=schema.ReplayBuffer(capacity=500, replay_ratio=2, learning_starts=20, max_lead=30)
    ),
)


def test_a_timeout_in_a_wait_for_another_process_names_the_wait():
    bench = Bench(PACED, workers=1)
    with pytest.raises(TimeoutError) as err:
        paced_train(bench.context("trainer", timeout=0.05))  # no worker has added a row
    assert str(err.value).startswith(
        "mprl.testing.Bench: trainer has not stopped after 0.05 s: it waits in replay.sample "
        "for rows: at the declared replay ratio (2 rows sampled per row added, from "
        "learning_starts=20 rows on) the rows added (0; 0 sampled) do not allow its batch"
    )
    # alone, a worker runs learning_starts + max_lead rows, then waits in add for a learner
    bench = Bench(PACED, workers=1)
    with pytest.raises(TimeoutError) as err:
        paced_worker(bench.context(0, steps=100, timeout=0.5))
    assert bench.env_steps == bench.state.replay.size() == 50
    assert str(err.value).startswith(
        "mprl.testing.Bench: worker 0 has not stopped after 0.5 s: it waits in replay.add for "
        "the learner: at a declared replay ratio the workers run max_lead rows ahead of the "
        "learner, so a worker waits once the rows added reach learning_starts + max_lead + "
        "(rows sampled + the learner's batch) / replay_ratio (here 20 + 30 + (0 + 0) / 2 = 50; "
        "50 added)"
    )
    assert "steps=50 or fewer" in str(err.value) and "max_lead=None" in str(err.value)
    # what the message says works: a learner that samples lets the worker on
    paced_train(bench.context("trainer", stop_after=3))
    paced_worker(bench.context(0, steps=10))
    assert bench.state.replay.size() == 60
    # a wait that is not a replay ratio's is named too
    ctx = Bench(PACED, workers=1).context(0, timeout=0.05)
    with pytest.raises(TimeoutError, match=r"it waits in replay.wait_size, for what another"):
        ctx.state.replay.wait_size(1_000)
