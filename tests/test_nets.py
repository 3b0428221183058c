"""mprl.nets.Adam: the same updates as torch.optim.Adam, without importing torch._dynamo."""

from __future__ import annotations

import multiprocessing as mp
import sys

import torch

from mprl.nets import ActorCriticConfig, Adam, make_optimizer
from mprl.runner import share_optimizer_state


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _loss(model: torch.nn.Module, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return model(torch.randn(16, 4, generator=gen)).pow(2).sum()


def test_adam_updates_exactly_as_torch_adam():
    ours, theirs = _model(), _model()
    opt = make_optimizer(ours.parameters(), ActorCriticConfig(lr=0.01))
    ref = torch.optim.Adam(theirs.parameters(), lr=0.01, eps=1e-5, fused=True)
    assert isinstance(opt, Adam) and isinstance(opt, torch.optim.Optimizer)
    for step in range(6):
        for model, optimizer in ((ours, opt), (theirs, ref)):
            optimizer.zero_grad()
            _loss(model, step).backward()
            optimizer.step()
    for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert p.grad is not None and torch.equal(p, q)
    mine, reference = opt.state_dict(), ref.state_dict()
    assert mine["param_groups"] == reference["param_groups"]
    for i, state in reference["state"].items():
        for key, value in state.items():
            assert torch.equal(mine["state"][i][key], value), key
    opt.zero_grad()
    assert all(p.grad is None for p in ours.parameters())  # set_to_none, as torch's default


def _step_in_child(model: torch.nn.Module, optimizer: Adam, out: mp.Queue) -> None:
    before = "torch._dynamo" in sys.modules
    optimizer.zero_grad()
    _loss(model, 0).backward()
    optimizer.step()
    saved = optimizer.state_dict()
    out.put((before, "torch._dynamo" in sys.modules, int(saved["state"][0]["step"])))


def test_a_spawned_process_steps_the_shared_adam_without_importing_dynamo():
    # torch.optim's own wrappers import torch._dynamo on first use: a second of start-up in
    # every process that steps a shared optimizer
    model = _model()
    model.share_memory()
    opt = make_optimizer(model.parameters(), ActorCriticConfig(lr=0.01))
    share_optimizer_state(opt)
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
