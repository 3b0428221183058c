"""The serial backend (``run --serial``): every process a turn-taking thread of this one."""

from __future__ import annotations

import json

import attrs
import torch

import mprl
from mprl import schema
from mprl.lib.nets import make_model, make_optimizer
from tests.conftest import cli


@attrs.frozen
class RoundsConfig:
    rounds: int = 20
    hidden: tuple[int, ...] = (8,)  # for mprl.lib.nets.make_model and make_optimizer
    lr: float = 1e-3


def rounds_worker(ctx: mprl.Context) -> None:
    for i in range(ctx.config.rounds):
        if ctx.should_stop():
            return
        with ctx.state.lock:
            ctx.state.order.append((i, ctx.rank))
        ctx.state.barrier.wait()  # nobody starts round i + 1 before all finished round i
        ctx.state.results.put(ctx.rank)
        ctx.add_steps(1)
    with ctx.state.done:
        ctx.state.finished.value += 1
        ctx.state.done.notify_all()
    while not ctx.should_stop():  # the run ends when the train process has everything
        pass


def rounds_train(ctx: mprl.Context) -> None:
    with ctx.state.done:
        ctx.state.done.wait_for(lambda: ctx.state.finished.value == ctx.n_workers)
    got = [ctx.state.results.get() for _ in range(ctx.n_workers * ctx.config.rounds)]
    ctx.log(received=len(got))


def hogwild_worker(ctx: mprl.Context) -> None:
    """Forward, hand the turn on, then backward and step: the others step the shared model
    in between (as other processes would)."""
    optimizer = ctx.optimizer
    while not ctx.should_stop():
        pi, v = ctx.model(torch.ones(1, 4))
        loss = pi.pow(2).sum() + v.pow(2).sum()
        ctx.add_steps(1)  # the other workers take their turn here
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def deadlock_worker(ctx: mprl.Context) -> None:
    ctx.state.barrier.wait()  # parties: workers + 1, and no train process ever comes


@mprl.hookimpl
def mprl_register_algorithms(register):
    shared = {
        "order": schema.List(),
        "lock": schema.Lock(),
        "results": schema.Queue(),
        "done": schema.Condition(),
        "finished": schema.Value("i", 0),
    }
    register(
        mprl.Algorithm(
            name="rounds", config_cls=RoundsConfig, make_model=make_model, worker=rounds_worker,
            train=rounds_train, schema=schema.Schema(barrier=schema.Barrier("workers"), **shared),
        )
    )  # fmt: skip
    register(
        mprl.Algorithm(
            name="hogwild", config_cls=RoundsConfig, make_model=make_model,
            make_optimizer=make_optimizer, worker=hogwild_worker,
        )
    )  # fmt: skip
    register(
        mprl.Algorithm(
            name="deadlock", config_cls=RoundsConfig, make_model=make_model,
            worker=deadlock_worker, schema=schema.Schema(barrier=schema.Barrier("all")),
        )
    )  # fmt: skip


def test_cli_serial_stops_at_breakpoint_with_a_prompt(installed, tmp_path):
    # pdb reads this process's stdin: in a spawned child it would read /dev/null and quit
    run_dir = tmp_path / "run"
    proc = cli(
        "run", "--plugin", "probe", "--serial", "--workers", "2", "--total-steps", "300",
        "--env", "Corridor-v0", "--run-dir", str(run_dir), "--quiet",
        "--set", "fault=breakpoint", "--set", "fault_rank=1", "--set", "fault_at_step=7",
        stdin="p ctx.rank\nup\np steps\nc\n",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "(Pdb) 1\n" in proc.stdout and "(Pdb) 7\n" in proc.stdout  # rank 1, at step 7
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["env_steps"] >= 300


def test_cli_serial_contradicting_backend_is_a_usage_error(installed):
    proc = cli("run", "--plugin", "probe", "--serial", "--backend", "local")
    assert proc.returncode == 2
    assert "--serial and --backend local contradict each other" in proc.stderr
