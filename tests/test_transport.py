"""The trajectory transport and weight publishing, with real spawned producers and readers."""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import pstats
import signal
import threading
import time

import gymnasium as gym
import pytest
import torch

from mprl.lib.nets import make_model, make_optimizer
from mprl.transport import FULL, Rollouts, Weights
from mprl_impala.algorithm import COUNT_EVERY_S, ImpalaConfig, update, vtrace
from tests.conftest import (
    cli,
    kill_worker_and_wait_for_restart,
    read_metrics,
    running,
    wait_for_metrics,
)

T, E = 5, 3
SPEC = {"obs": ((T + 1, E, 2), torch.float32), "action": ((T, E), torch.int64)}
SPAWN = mp.get_context("spawn")


def produce(rollouts: Rollouts, rank: int, count: int, stop) -> None:
    for seq in range(count):
        index = rollouts.acquire(rank, stop.is_set)
        if index is None:
            return
        slot = rollouts.slot(index)
        slot["obs"].fill_(rank * 1000 + seq)
        slot["action"].copy_(torch.arange(T * E).view(T, E) + seq)
        slot["version"].fill_(seq)
        slot["source"].fill_(rank)
        rollouts.commit(index)


def test_slots_round_trip_exactly_under_concurrent_producers():
    rollouts = Rollouts(SPEC, workers=3, slots_per_worker=2)  # slots are reused many times
    stop = SPAWN.Event()
    producers = [SPAWN.Process(target=produce, args=(rollouts, r, 40, stop)) for r in range(3)]
    for proc in producers:
        proc.start()
    seen, last = [], {}
    for _ in range(3 * 40):
        index = rollouts.take(lambda: False, timeout=60)
        assert index is not None
        slot = rollouts.slot(index)
        rank, seq = int(slot["source"]), int(slot["version"])
        assert torch.all(slot["obs"] == rank * 1000 + seq)  # not torn, not mixed
        assert torch.equal(slot["action"], torch.arange(T * E).view(T, E) + seq)
        assert seq == last.get(rank, -1) + 1  # each worker's rollouts arrive in order
        last[rank] = seq
        seen.append((rank, seq))
        rollouts.release(index)
    for proc in producers:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    assert sorted(seen) == [(r, s) for r in range(3) for s in range(40)]  # each exactly once


def test_back_pressure_blocks_instead_of_dropping():
    rollouts = Rollouts(SPEC, workers=1, slots_per_worker=2)
    never = lambda: False  # noqa: E731
    a = rollouts.acquire(0, never)
    rollouts.commit(a)
    b = rollouts.acquire(0, never)
    rollouts.commit(b)
    start = time.monotonic()
    assert rollouts.acquire(0, never, timeout=0.3) is None  # both slots full: the worker waits
    assert time.monotonic() - start >= 0.3
    assert rollouts.take(never, timeout=1) == a  # oldest first
    rollouts.release(a)
    assert rollouts.acquire(0, never, timeout=1) == a  # the freed slot comes back
    assert rollouts.take(never, timeout=1) == b and rollouts.take(never, timeout=0.2) is None


def test_a_killed_writer_leaves_nothing_locked():
    rollouts = Rollouts(SPEC, workers=1, slots_per_worker=1)
    stop = SPAWN.Event()
    first = SPAWN.Process(target=produce, args=(rollouts, 0, 10**6, stop))
    first.start()  # fills its slot, then waits for the learner to free it
    index = rollouts.take(lambda: False, timeout=60)
    first.kill()  # dies waiting or writing: nothing of the transport is held
    first.join()
    rollouts.release(index)
    again = SPAWN.Process(target=produce, args=(rollouts, 0, 1, stop))  # the restarted rank
    again.start()
    assert rollouts.take(lambda: False, timeout=60) == index
    again.join(timeout=30)
    assert again.exitcode == 0


def commit(rollouts: Rollouts, value: float, rank: int = 0) -> int:
    """``rank`` writes a rollout of ``value``s into its next slot and hands it over."""
    index = rollouts.acquire(rank, lambda: False, timeout=5)
    assert index is not None
    rollouts.slot(index)["obs"].fill_(value)
    rollouts.slot(index)["source"].fill_(rank)
    rollouts.commit(index)
    return index


def test_take_batch_stacks_rollouts_and_frees_their_slots():
    rollouts = Rollouts(SPEC, workers=1, slots_per_worker=3)
    commit(rollouts, 1.0)
    commit(rollouts, 2.0)
    batch = rollouts.take_batch(2, lambda: False)
    assert batch["obs"].shape == (T + 1, 2, E, 2) and batch["version"].shape == (2,)
    assert batch["obs"][0, :, 0, 0].tolist() == [1.0, 2.0]
    assert len({rollouts.acquire(0, lambda: False, timeout=1) for _ in range(3)}) == 3


def test_take_batch_orders_a_batch_by_worker_rank_whatever_order_the_rollouts_came_in():
    rollouts = Rollouts(SPEC, workers=3, slots_per_worker=3)  # one cursor here for all ranks
    for value, rank in ((1.0, 2), (2.0, 1), (3.0, 2), (4.0, 0)):  # finished in this order
        commit(rollouts, value, rank)
    batch = rollouts.take_batch(4, lambda: False)
    assert batch["source"].tolist() == [0, 1, 2, 2]
    assert batch["obs"][0, :, 0, 0].tolist() == [4.0, 2.0, 1.0, 3.0]  # a rank's own order kept


def test_take_batch_frees_each_slot_before_the_batch_is_complete():
    rollouts = Rollouts(SPEC, workers=1, slots_per_worker=1)  # one slot, a batch of two
    result: list[dict[str, torch.Tensor] | None] = []
    learner = threading.Thread(
        target=lambda: result.append(rollouts.take_batch(2, lambda: False)), daemon=True
    )
    learner.start()
    assert commit(rollouts, 1.0) == 0
    assert commit(rollouts, 2.0) == 0  # only if the learner freed the slot mid-batch
    learner.join(timeout=5)
    assert result[0]["obs"][0, :, 0, 0].tolist() == [1.0, 2.0]


def test_take_batch_keeps_what_it_copied_when_stopped():
    rollouts = Rollouts(SPEC, workers=1, slots_per_worker=2)
    commit(rollouts, 1.0)
    assert rollouts.take_batch(2, lambda: True) is None  # one ready, then the stop: no batch
    commit(rollouts, 2.0)
    batch = rollouts.take_batch(2, lambda: False)  # nothing was lost
    assert batch["obs"][0, :, 0, 0].tolist() == [1.0, 2.0]


def test_blocked_producers_return_when_stopped_with_full_slots():
    rollouts = Rollouts(SPEC, workers=2, slots_per_worker=1)
    stop = SPAWN.Event()
    # nobody consumes: both slots end up full, every producer waits for its slot
    producers = [SPAWN.Process(target=produce, args=(rollouts, r, 100, stop)) for r in range(2)]
    for proc in producers:
        proc.start()
    deadline = time.monotonic() + 60  # a cold start imports torch slowly
    while not (rollouts._state_np == FULL).all() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # the producers are waiting for their slots now
    assert (rollouts._state_np == FULL).all() and all(proc.is_alive() for proc in producers)
    start = time.monotonic()
    stop.set()
    for proc in producers:
        proc.join(timeout=10)
        assert proc.exitcode == 0
    assert time.monotonic() - start < 2
    assert rollouts.take(lambda: False, timeout=1) is not None  # the full slots are still there


def read_weights(weights: Weights, shared: torch.nn.Module, out, stop) -> None:
    local = torch.nn.Linear(64, 64)
    have, torn, versions = -1, 0, []
    out.put("reading")
    while not stop.is_set():
        have = weights.pull(shared, local, have)
        values = torch.cat([p.detach().flatten() for p in local.parameters()])
        torn += int(not torch.all(values == values[0]))  # the learner writes one value per step
        if not versions or versions[-1] != have:
            versions.append(have)
            if values[0] != have:
                torn += 1
    out.put((torn, versions))


def test_weights_reach_readers_whole_with_increasing_versions():
    shared = torch.nn.Linear(64, 64)
    with torch.no_grad():
        for p in shared.parameters():
            p.fill_(0)
    shared.share_memory()
    weights, out, stop = Weights(), SPAWN.Queue(), SPAWN.Event()
    reader = SPAWN.Process(target=read_weights, args=(weights, shared, out, stop))
    reader.start()
    assert out.get(timeout=60) == "reading"  # not a fixed sleep: a cold start imports slowly
    for version in range(1, 3001):
        with weights.writing(), torch.no_grad():
            for p in shared.parameters():
                p.fill_(version)
    assert weights.version == 3000
    time.sleep(0.5)
    stop.set()
    torn, versions = out.get(timeout=30)
    reader.join(timeout=10)
    assert torn == 0, f"{torn} reads saw a half-written model"
    assert versions == sorted(versions) and versions[-1] == 3000 and len(versions) > 1


def wait_for_update(weights: Weights, newer_than: int, out, stop) -> None:
    out.put(weights.wait(newer_than, stop.is_set))


def test_wait_sleeps_until_an_update_is_complete_and_returns_on_stop():
    weights, out, stop = Weights(), SPAWN.Queue(), SPAWN.Event()
    assert weights.wait(-1, lambda: False, timeout=0.1) == 0  # version 0 is newer than -1
    assert weights.wait(0, lambda: False, timeout=0.2) is None  # nothing newer: times out
    waiter = SPAWN.Process(target=wait_for_update, args=(weights, 0, out, stop))
    waiter.start()
    with weights.writing():
        time.sleep(3)  # a long update: the waiter must not return in the middle of it
        assert out.empty()
    assert out.get(timeout=10) == 1  # released by the completed write
    waiter.join(timeout=10)
    # a waiter with nothing to wait for returns None once stopped
    waiter = SPAWN.Process(target=wait_for_update, args=(weights, 5, out, stop))
    waiter.start()
    time.sleep(1)
    stop.set()
    assert out.get(timeout=10) is None
    waiter.join(timeout=10)
    assert waiter.exitcode == 0


def _naive_vtrace(log_rhos, discounts, rewards, values, bootstrap, rho_bar, c_bar):
    """V-trace as written in the paper (eq. 1): a sum over the rest of the rollout."""
    rhos = log_rhos.exp()
    t_len = rewards.shape[0]
    all_values = torch.cat([values, bootstrap.unsqueeze(0)])
    vs = torch.empty_like(values)
    for s in range(t_len):
        total = values[s].clone()
        for t in range(s, t_len):
            trace = torch.ones_like(bootstrap)
            for i in range(s, t):
                trace = trace * discounts[i] * rhos[i].clamp(max=c_bar)
            delta = rhos[t].clamp(max=rho_bar) * (
                rewards[t] + discounts[t] * all_values[t + 1] - all_values[t]
            )
            total = total + trace * delta
        vs[s] = total
    return vs


def test_vtrace_matches_the_paper_and_on_policy_returns():
    g = torch.Generator().manual_seed(0)
    t_len, n = 7, 4
    log_rhos = torch.randn(t_len, n, generator=g)
    discounts = 0.9 * (torch.rand(t_len, n, generator=g) > 0.2).float()
    rewards, values = torch.randn(t_len, n, generator=g), torch.randn(t_len, n, generator=g)
    bootstrap = torch.randn(n, generator=g)
    vs, _ = vtrace(log_rhos, discounts, rewards, values, bootstrap, 1.0, 0.9)
    expected = _naive_vtrace(log_rhos, discounts, rewards, values, bootstrap, 1.0, 0.9)
    assert torch.allclose(vs, expected, atol=1e-5)
    # on-policy (rho = 1): V-trace targets are the bootstrapped discounted returns
    vs, adv = vtrace(torch.zeros(t_len, n), discounts, rewards, values, bootstrap)
    returns, running = torch.empty_like(rewards), bootstrap
    for t in range(t_len - 1, -1, -1):
        running = rewards[t] + discounts[t] * running
        returns[t] = running
    assert torch.allclose(vs, returns, atol=1e-5)
    next_vs = torch.cat([vs[1:], bootstrap.unsqueeze(0)])
    assert torch.allclose(adv, rewards + discounts * next_vs - values, atol=1e-5)


def test_impala_update_learns_the_rewarded_action_and_steps_inside_writing():
    # a batch laid out as take_batch gives it ([T, B, E, ...]), collected on-policy: action 0
    # earns 1, action 1 nothing, and no episode ends
    cfg = ImpalaConfig(unroll=8, envs_per_worker=4, batch_rollouts=2, entropy_coef=0.0, lr=1e-2)
    obs_space = gym.spaces.Box(-1.0, 1.0, (3,))
    torch.manual_seed(0)
    model = make_model(obs_space, gym.spaces.Discrete(2), cfg)
    optimizer = make_optimizer(model.parameters(), cfg)
    obs = torch.rand(cfg.unroll + 1, cfg.batch_rollouts, cfg.envs_per_worker, 3) * 2 - 1

    def p_rewarded() -> float:
        with torch.no_grad():
            return float(torch.softmax(model.pi(obs), -1)[..., 0].mean())

    def weights() -> list[torch.Tensor]:
        return [p.detach().clone() for p in model.parameters()]

    steps: list[bool] = []  # per update: the weights changed inside writing(), and only there
    published = weights()

    @contextlib.contextmanager
    def writing():
        nonlocal published
        before = weights()
        yield
        unchanged = all(map(torch.equal, published, before))
        published = weights()
        steps.append(unchanged and not all(map(torch.equal, before, published)))

    start = p_rewarded()
    for _ in range(30):
        with torch.no_grad():
            out = model.pi(obs[:-1].flatten(0, 2))
        actions = model.sample(out)
        logp, _ = model.log_prob_entropy(out, actions)
        actions, logp = actions.view(obs[:-1].shape[:3]), logp.view(obs[:-1].shape[:3])
        batch = {
            "obs": obs, "action": actions, "logp": logp, "reward": (actions == 0).float(),
            "done": torch.zeros_like(logp),
        }  # fmt: skip
        stats = update(model, optimizer, cfg, batch, writing)
        assert set(stats) == {"policy_loss", "value_loss", "entropy", "grad_norm"}
    assert steps == [True] * 30
    assert 0.4 < start < 0.6 and p_rewarded() > 0.9


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
def test_short_impala_run_through_the_cli(tmp_path, env):
    run_dir = tmp_path / "run"
    proc = cli(
        "run", "--plugin", "impala", "--env", env, "--workers", "2", "--total-steps", "40000",
        "--run-dir", str(run_dir), "--quiet", "--set", "envs_per_worker=8",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= 40000 and min(summary["per_worker_steps"]) > 0
    learner = [r for r in read_metrics(run_dir) if r["source"] == "trainer"]
    assert learner and learner[-1]["updates"] > 10
    assert all(0 <= r["staleness"] < 20 for r in learner)
    # the per-worker counters in the Manager (control state) saw every worker hand rollouts over
    assert learner[-1]["rollouts_min"] > 0
    episodes = [r for r in read_metrics(run_dir) if "episode_return" in r]
    assert {r["source"] for r in episodes} == {"worker:0", "worker:1"}


def test_impala_worker_killed_mid_run_is_restarted_and_learning_goes_on(tmp_path):
    # one slot per worker: if the dead worker left its slot or any lock behind, its restart
    # could not hand a rollout over again
    run_dir = tmp_path / "run"
    args = [
        "--plugin", "impala", "--workers", "2", "--total-steps", "1e9", "--run-dir", str(run_dir),
        "--quiet", "--max-restarts", "1", "--restart-delay", "0.2",
        "--set", "slots_per_worker=1", "--set", "batch_rollouts=2", "--set", "lr=1e-6",
    ]  # fmt: skip
    with running(args) as proc:
        wait_for_metrics(run_dir, lambda r: r.get("source") == "worker:1")
        restart = kill_worker_and_wait_for_restart(proc, run_dir, 1)
        # the learner keeps updating after the restart
        wait_for_metrics(
            run_dir,
            lambda r: r.get("source") == "trainer" and r["wall"] > restart["wall"] + 3
            and r["rollouts_min"] > 0,
        )  # fmt: skip
        updates_then = max(r["updates"] for r in read_metrics(run_dir) if "updates" in r)
        time.sleep(3)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    metrics = read_metrics(run_dir)
    assert max(r["updates"] for r in metrics if "updates" in r) > updates_then
    # the restarted worker stepped on through more than two rollouts: its one slot came back
    config = ImpalaConfig()
    after = [r for r in metrics if r["source"] == "worker:1" and r["wall"] > restart["wall"]]
    assert (
        sum(r.get("episode_length", 0) for r in after) > 2 * config.unroll * config.envs_per_worker
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"] == [0, 1]


def test_a_profiled_impala_worker_makes_no_manager_call_per_step(tmp_path):
    run_dir = tmp_path / "run"
    proc = cli(
        "run", "--plugin", "impala", "--workers", "2", "--total-steps", "30000", "--quiet",
        "--run-dir", str(run_dir), "--set", "envs_per_worker=8", env={"MPRL_PROFILE": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    steps = json.loads((run_dir / "summary.json").read_text())["per_worker_steps"][0]
    profile = pstats.Stats(str(run_dir / "logs" / "worker-0.prof"))
    stats = profile.stats  # type: ignore[attr-defined]

    def calls(file_part: str, name: str) -> int:
        return sum(v[1] for (f, _, fn), v in stats.items() if file_part in f and fn == name)

    env_steps = calls("cartpole.py", "step")
    assert env_steps >= steps > 0  # the profile covers the per-step path
    rollouts = steps // (8 * 16)
    manager_calls = calls("managers.py", "_callmethod")
    # the per-worker counter: read at the start, written once a second and at the end; none
    # per step, none per rollout
    seconds = profile.total_tt  # type: ignore[attr-defined]
    assert manager_calls <= seconds / COUNT_EVERY_S + 3 < rollouts, (
        manager_calls,
        seconds,
        rollouts,
    )
