"""mprl.lib.norms: ValueNorm (the returns' running mean and variance a critic learns against,
mappo's and the tom2c example's), and the loading of state dicts that kept those moments in one
buffer of their own."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

from mprl.lib.norms import ValueNorm


def test_value_norm_holds_the_moments_of_every_return_seen_and_inverts_itself():
    norm = ValueNorm()
    values = torch.tensor([1.5, -2.0, 4.0])
    assert torch.equal(norm(values), values) and torch.equal(norm.denormalize(values), values)
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randn(n, generator=gen) * 7 + 3 for n in (5, 40, 1, 300)]
    for batch in batches:
        norm.update(batch.view(-1, 1))  # any shape: every element is one return
    seen = torch.cat(batches).double()
    assert norm.count.item() == len(seen)
    assert norm.mean.item() == pytest.approx(seen.mean().item(), rel=1e-12)
    assert norm.var.item() == pytest.approx(seen.var(unbiased=False).item(), rel=1e-12)
    standard = norm(seen.float())
    assert standard.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert standard.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-5)
    far = torch.tensor([1e3])  # unclipped, unlike observations: a target is what it is
    torch.testing.assert_close(norm.denormalize(norm(far)), far)


class Critic(nn.Module):
    """A model that kept its returns' moments by hand, then got a ValueNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.v = nn.Linear(2, 1)
        self.value_norm = ValueNorm()
        ValueNorm.load_old_moments(self, "ret_moments", "value_norm")


def test_a_state_dict_of_the_moments_in_one_buffer_loads_into_the_value_norm():
    old = {**Critic().state_dict(), "ret_moments": torch.tensor([2.5, 9.0, 123.0])}
    for key in ("mean", "var", "count"):
        del old[f"value_norm.{key}"]
    wrapper = nn.Sequential(Critic())  # under a prefix too, as a submodule
    for model, state_dict in (
        (Critic(), old),
        (pickle.loads(pickle.dumps(Critic())), old),  # a spawned child's copy
        (copy.deepcopy(Critic()), old),  # a worker's copy
        (wrapper[0], old),
    ):
        model.load_state_dict(state_dict)  # strict: no key left over or missing
        assert (model.value_norm.mean.item(), model.value_norm.var.item()) == (2.5, 9.0)
        assert model.value_norm.count.item() == 123.0
        assert model.value_norm.mean.dtype == torch.float64
    wrapper.load_state_dict({f"0.{k}": v for k, v in old.items()})
    assert wrapper[0].value_norm.denormalize(torch.tensor([1.0])).item() == pytest.approx(5.5)
    new = Critic().state_dict()  # today's state dicts load as they are
    Critic().load_state_dict(new)
    assert "ret_moments" not in new
