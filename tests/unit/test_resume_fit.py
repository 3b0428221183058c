"""Resuming with another worker count keeps what can be kept (``Schema.fit``): replay rows
re-partitioned across the new workers (the newest kept, each ring in order, its next row
overwriting its oldest), per-worker lists extended or cut, and a refusal naming the fields that
cannot be fitted unless the user drops them; serial runs resumed with 3 workers and with 1."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from mprl import kinds, schema
from mprl.errors import UsageError
from mprl.testing import plugin_manager, run_serial
from mprl.transport.memory import MemoryReplay
from mprl_builtin import sac as sac_plugin
from tests.plugins import mprl_testplugin


def fit(declared, data, dims):
    """A field's or a schema's checkpointed data made to fit a run of ``dims`` (mprl.kinds)."""
    if isinstance(declared, schema.Schema):
        return kinds.fit(declared, data, dims)
    return kinds.of(declared).fit(declared, data, dims)


ROW = {"x": ((), torch.int64), "obs": ((2,), torch.float32)}
SPACES = gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2)


def dims(workers: int, config: object = None) -> schema.Dims:
    return schema.Dims(workers, *SPACES, config)


def filled(workers: int, capacity: int, added: list[int]) -> MemoryReplay:
    """A replay buffer whose worker ``w`` added ``added[w]`` rows; row ``k`` of worker ``w``
    holds ``x = 1000 * w + k`` (and ``obs`` = ``[x, -x]``)."""
    replay = MemoryReplay(ROW, capacity, workers, share=False)
    for w, n in enumerate(added):
        bound = replay.bind(w, lambda: False)
        for k in range(n):
            x = 1000 * w + k
            bound.add(x=torch.tensor([x]), obs=torch.tensor([[float(x), -float(x)]]))
    return replay


def rings(replay: MemoryReplay) -> list[list[int]]:
    """Each worker's rows, oldest first, as ``x``."""
    state = replay.state()
    per, out = replay.per_worker, []
    for w, head in enumerate(state["heads"].tolist()):
        size = min(head, per)
        out.append([int(state["x"][w * per + k % per]) for k in range(head - size, head)])
    return out


def test_replay_rows_are_re_partitioned_across_more_workers_in_order():
    decl = schema.ReplayBuffer(capacity=12, row=ROW)
    old = filled(2, 12, [9, 4])  # worker 0's ring (6 rows) wrapped: it holds rows 3..8
    assert rings(old) == [[3, 4, 5, 6, 7, 8], [1000, 1001, 1002, 1003]]
    data, note = fit(decl, old.state(), dims(3))
    assert note == "10 rows re-partitioned from 2 workers (6 rows each) to 3 (4 rows each)"
    new = MemoryReplay(ROW, 12, 3, share=False)
    assert new.load(data)  # the shapes of a 3-worker buffer
    assert new.size() == 10 and new.state()["heads"].tolist() == [4, 3, 3]
    # every row kept, whole (obs goes with its x), none twice
    sample = new.sample(2000, torch.Generator().manual_seed(0))
    assert set(sample["x"].tolist()) == {3, 4, 5, 6, 7, 8, 1000, 1001, 1002, 1003}
    assert torch.equal(sample["obs"][:, 0], sample["x"].float())
    # the workers' rows in turn, oldest first, dealt round: each ring is in order of age
    order = [3, 4, 5, 1000, 6, 1001, 7, 1002, 8, 1003]  # by age, then rank: 8, 1003 newest
    assert rings(new) == [order[0::3], order[1::3], order[2::3]]
    # a worker's next row goes after its newest, and a full ring overwrites its oldest
    bound = new.bind(0, lambda: False)
    bound.add(x=torch.tensor([-1]), obs=torch.zeros(1, 2))
    assert rings(new)[0] == [*order[0::3][1:], -1] and new.size() == 10


def test_the_newest_rows_are_kept_when_they_do_not_all_fit():
    old = filled(3, 12, [4, 4, 2])
    # one worker, capacity 5 (a --set buffer_size=5 with --workers 1): the 5 newest stay
    decl = schema.ReplayBuffer(capacity="config.size", row=ROW)
    data, note = fit(decl, old.state(), dims(1, config=type("C", (), {"size": 5})()))
    assert note == (
        "5 rows re-partitioned from 3 workers (4 rows each) to 1 (5 rows each); the 5 oldest "
        "did not fit and were dropped"
    )
    new = MemoryReplay(ROW, 5, 1, share=False)
    assert new.load(data)
    assert rings(new) == [[2, 1002, 3, 1003, 2001]]  # ages 1 (by rank), then 0
    assert new.state()["heads"].tolist() == [5]


def test_a_replay_buffer_that_fits_is_kept_as_it_is_and_other_rows_cannot_be_fitted():
    decl = schema.ReplayBuffer(capacity=12, row=ROW)
    state = filled(2, 12, [3, 2]).state()
    data, note = fit(decl, state, dims(2))
    assert note is None and data.keys() == state.keys()
    assert all(torch.equal(data[k], state[k]) for k in state)
    other = schema.ReplayBuffer(capacity=12, row={**ROW, "obs": ((3,), torch.float32)})
    with pytest.raises(ValueError, match=r"its rows' 'obs' are \(2,\) torch.float32 saved"):
        fit(other, state, dims(3))
    assert fit(schema.ReplayBuffer(12, row=ROW, checkpoint=False), None, dims(3)) == (None, None)


def test_per_worker_lists_are_extended_with_their_initial_value_or_cut():
    assert fit(schema.PerWorker(0), [4, 5], dims(2)) == ([4, 5], None)
    assert fit(schema.PerWorker(0), [4, 5], dims(4)) == (
        [4, 5, 0, 0],
        "2 slots saved, 4 in this run: ranks 0-1 kept, ranks 2-3 start at 0",
    )
    assert fit(schema.PerWorker(""), ["a", "b", "c"], dims(1)) == (
        ["a"],
        "3 slots saved, 1 in this run: rank 0 kept, the slots of ranks 1-2 dropped (['b', 'c'])",
    )
    assert fit(schema.PerWorker(list), [[1], [2, 3]], dims(3))[0] == [[1], [2, 3], []]
    assert fit(schema.PerWorker(dict), [{"a": 1}], dims(2))[0] == [{"a": 1}, {}]
    long, note = fit(schema.PerWorker(list), [[0] * 50, [1] * 50], dims(1))
    assert long == [[0] * 50] and note.endswith("the slots of rank 1 dropped")  # not shown
    assert fit(schema.Array("i", initial=7), [1, 2], dims(3)) == (
        [1, 2, 7],
        "2 slots saved, 3 in this run: ranks 0-1 kept, rank 2 starts at 7",
    )
    with pytest.raises(ValueError, match="2 values saved, 3 in this run"):
        fit(schema.Array("i", size="all"), [1, 2], dims(2))


def test_a_tensor_sized_by_the_workers_cannot_be_fitted():
    seen = schema.Tensor(shape=("workers", 3))
    same = torch.ones(2, 3)
    assert fit(seen, same, dims(2)) == (same, None)
    with pytest.raises(ValueError, match=r"shape \(2, 3\) torch.float32 saved, \(3, 3\) "):
        fit(seen, same, dims(3))
    with pytest.raises(ValueError, match=r"torch\.int64 saved"):
        fit(seen, same.long(), dims(2))


def test_schema_fit_says_per_field_what_it_did_and_what_cannot_be_fitted():
    decl = schema.Schema(
        visits=schema.PerWorker(0), seen=schema.Tensor(shape=("workers",)),
        total=schema.Counter(), replay=schema.ReplayBuffer(capacity=12, row=ROW),
        lock=schema.Lock(),
    )  # fmt: skip
    snapshot = {
        "visits": [1, 2], "seen": torch.zeros(2), "total": 7,
        "replay": filled(2, 12, [1, 1]).state(), "gone": [1, 2],
    }  # fmt: skip
    fitted = fit(decl, snapshot, dims(3))
    assert isinstance(fitted, schema.Fitted)
    assert set(fitted.data) == {"visits", "total", "replay"} and fitted.data["total"] == 7
    assert fitted.data["visits"] == [1, 2, 0]
    assert set(fitted.notes) == {"visits", "replay", "gone"}
    assert fitted.notes["gone"] == "in the checkpoint but no longer declared: left out"
    assert list(fitted.unfit) == ["seen"] and "saved, (3,)" in fitted.unfit["seen"]
    assert fit(decl, snapshot, dims(2)).notes == {"gone": fitted.notes["gone"]}


# -- resumed serial runs -----------------------------------------------------------------------

TINY = {"hidden": [16, 16], "batch_size": 16, "learning_starts": 40, "buffer_size": 600}


def sac(tmp_path, name: str, **kw):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run_serial(
            "sac", plugins=[sac_plugin], env="Pendulum-v1", run_dir=tmp_path / name, **kw
        )
    finally:
        torch.set_num_threads(threads)


def replay_of(result) -> dict:
    return torch.load(result.run_dir / "checkpoints" / "last.pt", weights_only=True)[
        "shared_state"
    ]["replay"]


def stored(replay: dict, per: int) -> set[tuple[float, ...]]:
    """The transitions a saved replay buffer holds, as their (obs, reward) values."""
    out = set()
    for w, head in enumerate(replay["heads"].tolist()):
        for i in range(w * per, w * per + min(head, per)):
            out.add((*replay["obs"][i].tolist(), float(replay["reward"][i])))
    return out


def test_a_serial_sac_resumed_with_three_workers_then_one_keeps_its_replay_rows(tmp_path):
    first = sac(tmp_path, "a", workers=2, total_steps=120, config=TINY)
    saved = replay_of(first)
    rows = int(saved["heads"].sum())
    assert rows == first.summary.env_steps >= 120  # a row per step, the rings not full
    more = sac(tmp_path, "b", workers=3, total_steps=240, resume=first.run_dir)
    assert more.summary.session == 1 and more.summary.status == "finished"
    [note] = [r for r in more.records if r.get("event") == "resume-state"]
    assert note["field"] == "replay" and note["message"] == (
        f"resume: shared-state field 'replay' (ReplayBuffer): {rows} rows re-partitioned from "
        "2 workers (300 rows each) to 3 (200 rows each)"
    )
    replay = replay_of(more)
    assert replay["heads"].shape == (3,)
    # the rows of the first session are there, and the second session's were added to them
    assert int(replay["heads"].sum()) == more.summary.env_steps >= 240
    assert stored(saved, 300) <= stored(replay, 200) and len(stored(saved, 300)) == rows
    last = sac(tmp_path, "c", workers=1, total_steps=300, resume=more.run_dir)
    replay = replay_of(last)
    assert replay["heads"].tolist() == [last.summary.env_steps]  # 600 rows: every one fits
    assert stored(saved, 300) <= stored(replay, 600)
    assert last.state.replay.size() == last.summary.env_steps


def test_a_per_worker_tensor_refuses_the_resume_unless_dropped_and_lists_are_fitted(tmp_path):
    pm = plugin_manager(mprl_testplugin)
    first = run_serial(
        "probe", plugins=pm, run_dir=tmp_path / "a", workers=2, total_steps=120, env="Corridor-v0"
    )
    visits = list(first.state.visits)
    assert all(v > 0 for v in visits)
    with pytest.raises(UsageError) as err:
        run_serial("probe", plugins=pm, run_dir=tmp_path / "b", workers=3, resume=first.run_dir)
    message = str(err.value)
    assert (
        "cannot resume checkpoint" in message and "with 3 workers (it was saved with 2)" in message
    )
    assert "shared-state field 'seen' (Tensor) cannot be fitted to this run" in message
    assert "--resume-drop seen" in message and "or resume with --workers 2" in message
    assert not (tmp_path / "b").exists()  # refused before the run directory was made
    with pytest.raises(UsageError, match="has no shared-state field of that name; its fields: "):
        run_serial(
            "probe", plugins=pm, run_dir=tmp_path / "b", workers=3, resume=first.run_dir,
            resume_drop="seen,nothing",
        )  # fmt: skip
    more = run_serial(
        "probe", plugins=pm, run_dir=tmp_path / "b", workers=3, total_steps=240,
        resume=first.run_dir, resume_drop=["seen"],
    )  # fmt: skip
    notes = {r["field"]: r["message"] for r in more.records if r.get("event") == "resume-state"}
    assert notes["seen"] == (
        "resume: shared-state field 'seen' (Tensor): its data dropped (--resume-drop); it "
        "starts as declared"
    )
    assert notes["visits"] == (
        "resume: shared-state field 'visits' (PerWorker): 2 slots saved, 3 in this run: "
        "ranks 0-1 kept, rank 2 starts at 0"
    )
    assert set(notes) == {"seen", "visits", "envs", "ready"}
    # the kept ranks counted on from the saved visits; the new one from 0
    now = list(more.state.visits)
    assert len(now) == 3 and now[0] >= visits[0] and now[1] >= visits[1]
    assert more.state.seen.tolist() == [float(s) for s in more.summary.per_worker_steps[:3]]
    # cut back to one worker: no Tensor saved with 3 to refuse once dropped; lists cut
    last = run_serial(
        "probe", plugins=pm, run_dir=tmp_path / "c", workers=1, total_steps=300,
        resume=more.run_dir, resume_drop="seen",
    )  # fmt: skip
    notes = {r["field"]: r["message"] for r in last.records if r.get("event") == "resume-state"}
    assert (
        "3 slots saved, 1 in this run: rank 0 kept, the slots of ranks 1-2 dropped"
        in (notes["visits"])
    )
    assert len(last.state.visits) == 1 and last.state.visits[0] >= now[0]
