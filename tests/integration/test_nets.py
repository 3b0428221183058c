"""mprl.lib.nets: Adam (the same updates as torch.optim.Adam, without importing torch._dynamo),
and mprl.lib.envbatch.EnvBatch (episodes, time-limit bootstrap and rollout slots, on real
environments)."""

from __future__ import annotations

import multiprocessing as mp
import sys

import torch

from mprl.host.job import materialize_optimizer_state
from mprl.lib.nets import ActorCriticConfig, Adam, make_optimizer
from tests.unit.test_nets import _loss, _model


def _step_in_child(model: torch.nn.Module, optimizer: Adam, out: mp.Queue) -> None:
    before = "torch._dynamo" in sys.modules
    optimizer.zero_grad()
    _loss(model, 0).backward()
    optimizer.step()
    saved = optimizer.state_dict()
    optimizer.load_state_dict(saved)  # as a resumed run does
    out.put((before, "torch._dynamo" in sys.modules, int(saved["state"][0]["step"])))


def test_a_spawned_process_steps_the_shared_adam_without_importing_dynamo():
    # torch.optim's own wrappers import torch._dynamo on first use: a second of start-up in
    # every process that steps a shared optimizer
    model = _model()
    model.share_memory()
    opt = make_optimizer(model.parameters(), ActorCriticConfig(lr=0.01))
    materialize_optimizer_state(opt)  # what a run does before it starts the processes
    for state in opt.state.values():
        for value in state.values():
            value.share_memory_()
    weights = [p.detach().clone() for p in model.parameters()]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_step_in_child, args=(model, opt, out))
    child.start()
    try:
        imported_at_start, imported_after, steps = out.get(timeout=60)
    finally:
        child.join()
    out.close()
    out.join_thread()
    assert child.exitcode == 0
    assert not imported_at_start and not imported_after
    assert steps == 1 and int(opt.state[next(model.parameters())]["step"]) == 1  # shared state
    assert any(not torch.equal(p, w) for p, w in zip(model.parameters(), weights, strict=True))
