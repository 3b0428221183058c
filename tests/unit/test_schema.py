"""Shared-state schema -> real Manager objects, for every supported kind, used across processes."""

from __future__ import annotations

import attrs
import gymnasium as gym
import pytest
import torch

from mprl import kinds
from mprl import schema as s
from mprl.errors import SchemaError
from mprl.testing import build_state
from mprl.transport.memory import MemoryBuilder

FULL = s.Schema(
    train_modes=s.PerWorker(True),
    n_iters=s.PerWorker(0),
    histories=s.PerWorker(list),
    per_worker_stats=s.PerWorker(dict),
    log=s.List([1, 2]),
    table=s.Dict({"a": 1}),
    ns=s.Namespace({"mode": "train", "epoch": 0}),
    lock=s.Lock(),
    rlock=s.RLock(),
    sem=s.Semaphore(2),
    bsem=s.BoundedSemaphore(1),
    cond=s.Condition(),
    event=s.Event(),
    barrier=s.Barrier("all"),
    queue=s.Queue(4),
    value=s.Value("i", 7),
    array=s.Array("d", "workers", 0.5),
    buffer=s.Tensor(shape=("workers", 5), dtype=torch.float64, fill=1.0),
)


def test_tensor_only_schema_needs_no_manager():
    tensors = s.Schema(a=s.Tensor(shape=(2,)), b=s.Tensor(shape=("all", 3), dtype=torch.int64))
    assert not kinds.needs_manager(tensors)
    no_manager = MemoryBuilder(None, torch.nn.Linear(1, 1), None, share=True, sleep=True)
    dims = s.Dims(4, gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2))
    state = kinds.build(tensors, no_manager, dims)
    assert state.b.shape == (5, 3) and state.b.is_shared()
    assert kinds.needs_manager(FULL)
    with pytest.raises(SchemaError, match=r"'lock' \(Lock\) needs a Manager"):
        kinds.build(s.Schema(lock=s.Lock()), no_manager, dims)


@attrs.frozen
class Custom(s.Field):
    """A declaration of a kind the core has no code for."""


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"modes": [True, True]},
            r"'modes': \[True, True\] is not a field declaration; use one of",
        ),
        (
            {"modes": s.PerWorker(object())},
            r"'modes' \(PerWorker\): initial value .* must be a scalar",
        ),
        (
            {"custom": Custom()},
            r"'custom': Custom is not a kind mprl knows how to build, share and checkpoint; "
            r"use one of mprl.schema.\{PerWorker, List",
        ),
        ({"_private": s.Lock()}, r"'_private': not a valid name"),
        ({"class": s.Lock()}, r"'class': not a valid name"),
        ({"v": s.Value("q!", 0)}, r"'v' \(Value\): typecode 'q!' is not one of"),
        ({"v": s.Value("i", "text")}, r"'v' \(Value\)"),
        (
            {"a": s.Array("d", "everyone")},
            r"'a' \(Array\): size 'everyone' must be an int, 'workers', 'all', 'config.FIELD'",
        ),
        ({"b": s.Barrier(0)}, r"'b' \(Barrier\): size 0 must be >= 1"),
        ({"q": s.Queue(-1)}, r"'q' \(Queue\): maxsize -1 must be an int >= 0"),
        ({"t": s.Tensor(shape=())}, r"'t' \(Tensor\): shape must have at least one dimension"),
        (
            {"t": s.Tensor(shape=(2,), dtype="float")},
            r"'t' \(Tensor\): dtype 'float' must be a torch.dtype",
        ),
        ({"d": s.Dict([1, 2])}, r"'d' \(Dict\): initial value \[1, 2\] must be a mapping"),
        ({"n": s.Namespace({"not ok": 1})}, r"'n' \(Namespace\): attribute names \['not ok'\]"),
        ({"l": s.List("abc")}, r"'l' \(List\): initial value 'abc' must be a list or tuple"),
        ({"sem": s.Semaphore(-2)}, r"'sem' \(Semaphore\): value -2 must be an int >= 0"),
    ],
)
def test_wrong_declarations_name_the_field(fields, message):
    with pytest.raises(SchemaError, match=message):
        s.Schema(**fields)


def test_a_misspelt_field_names_the_declared_ones():
    state = build_state(s.Schema(steps=s.PerWorker(0), lock=s.Lock()), 2)
    with pytest.raises(
        AttributeError, match=r"no field 'step'; the algorithm's schema declares: lock, steps"
    ):
        state.step  # noqa: B018


@pytest.mark.parametrize(
    ("maxsize", "config", "expected"),
    [
        (0, None, 0),
        (3, None, 3),
        ("config.queue_size", {"queue_size": 8}, 8),
        ("config.queue_size", {"queue_size": 0}, 0),  # unbounded, from the config
        ("workers", None, 3),
        ("all", None, 4),
        (lambda dims: 2 * dims.workers, None, 6),
    ],
)
def test_a_queue_maxsize_is_a_size_read_like_the_others(maxsize, config, expected):
    state = build_state(s.Schema(q=s.Queue(maxsize)), 3, config=config)
    assert state.q.maxsize == expected


@pytest.mark.parametrize(
    ("maxsize", "config", "message"),
    [
        ("queue_size", None, r"maxsize 'queue_size' must be an int >= 0 \(0: unbounded\), "),
        (1.5, None, r"maxsize 1.5 must be an int >= 0"),
        (True, None, r"maxsize True must be an int >= 0"),
        ("config.queue_size", {"queue_size": -1}, r"size 'config.queue_size' is -1; .* >= 0"),
        ("config.queue_size", {"size": 1}, r"size '.*': the config has no field 'queue_size'"),
    ],
)
def test_a_bad_queue_maxsize_names_the_field(maxsize, config, message):
    with pytest.raises(SchemaError, match=rf"'q' \(Queue\): {message}"):
        build_state(s.Schema(q=s.Queue(maxsize)), 2, config=config)
