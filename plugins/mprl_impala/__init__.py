"""IMPALA, a built-in algorithm plugin (registered through the ``mprl`` entry point).

The actor-learner shape of the classic multi-process main: workers only collect experience,
one train process learns. Rollouts travel through shared-memory slots
(:class:`mprl.transport.Rollouts`), weights come back through the shared model and a version
counter (:class:`mprl.transport.Weights`), and V-trace corrects for the policy lag.
"""

from __future__ import annotations

import mprl
from mprl.nets import make_model, make_optimizer
from mprl_impala.algorithm import (
    SCHEMA,
    ImpalaConfig,
    make_shared,
    train,
    worker,
)

__version__ = "0.1.0"

ALGORITHM = mprl.Algorithm(
    name="impala",
    config_cls=ImpalaConfig,
    make_model=make_model,
    make_optimizer=make_optimizer,
    make_shared=make_shared,
    schema=SCHEMA,
    worker=worker,
    train=train,
    description="IMPALA: collecting workers, one V-trace learner, shared-memory rollout slots",
)


@mprl.hookimpl
def mprl_register_algorithms(register):
    register(ALGORITHM)
