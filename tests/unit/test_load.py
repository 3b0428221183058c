"""``mprl.load``: a checkpoint written by a real (serial) run read back as objects, the model
acting; the errors naming the file, the plugin and its distribution; and the checkpoint format
documented in docs/reference.md kept true to what mprl/host/checkpoint.py writes."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
import torch

import mprl
from mprl.errors import UsageError
from mprl.host import checkpoint
from mprl.testing import plugin_manager, run_serial
from mprl_builtin import sac
from tests.conftest import REPO
from tests.plugins import mprl_testplugin

TINY = {
    "hidden": [16, 16], "batch_size": 16, "learning_starts": 50, "buffer_size": 400,
}  # fmt: skip


@pytest.fixture(scope="module")
def sac_run(tmp_path_factory: pytest.TempPathFactory):
    """A real serial sac run on Pendulum: its run directory and what run_serial saw."""
    run_dir = tmp_path_factory.mktemp("load") / "sac"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = run_serial(
            "sac", plugins=[sac], env="Pendulum-v1", run_dir=run_dir, total_steps=150,
            workers=2, seed=3, config=TINY,
        )  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    return run_dir, result


def test_load_gives_the_model_ready_to_act_and_everything_the_run_saved(sac_run):
    run_dir, result = sac_run
    loaded = mprl.load(run_dir, plugins=plugin_manager(sac))
    assert isinstance(loaded, mprl.Checkpoint)
    assert loaded.path == run_dir / "checkpoints" / "last.pt"
    assert (loaded.algorithm, loaded.plugin) == ("sac", "mprl_builtin.sac")
    assert loaded.spec.name == "sac" and loaded.spec.config_cls is sac.SACConfig
    assert isinstance(loaded.config, sac.SACConfig) and loaded.config.hidden == (16, 16)
    assert isinstance(loaded.run, mprl.RunConfig)
    assert (loaded.run.env, loaded.run.workers, loaded.run.seed) == ("Pendulum-v1", 2, 3)
    assert loaded.run.backend == "serial"  # the run's own options, as saved
    assert loaded.env_steps == result.summary.env_steps >= 150
    assert loaded.episodes == result.summary.episodes and loaded.session == 0
    assert loaded.format_version == checkpoint.VERSION and loaded.mprl_version == mprl.__version__
    # the model: the run's weights, on the CPU, in eval mode
    assert not loaded.model.training
    saved, trained = loaded.model.state_dict(), result.model.state_dict()
    assert saved.keys() == trained.keys()
    assert all(torch.equal(saved[k], trained[k]) for k in saved)
    assert all(t.device.type == "cpu" for t in saved.values())
    assert isinstance(loaded.observation_space, gym.spaces.Box)
    # it acts on a batch: a tensor or an array, deterministic or sampled
    obs = np.stack([loaded.observation_space.sample() for _ in range(5)])
    actions = loaded.act(obs, deterministic=True)
    assert np.shape(actions) == (5, 1)
    assert np.allclose(actions, loaded.act(torch.as_tensor(obs), True))  # the mode repeats
    assert all(loaded.action_space.contains(np.asarray(a, np.float32)) for a in actions)
    assert np.shape(loaded.model.act(torch.as_tensor(obs), False)) == (5, 1)
    # the optimizers' states, by name, and the shared state's data
    assert loaded.optimizer_state is None
    assert set(loaded.optimizer_states) == {"actor", "critic", "alpha"}
    updates = loaded.shared_state["updates"]
    assert updates > 0
    for state in loaded.optimizer_states.values():  # each Adam stepped once per update
        assert {int(s["step"]) for s in state["state"].values()} == {updates}
    optimizer = loaded.spec.optimizers["critic"](loaded.model, loaded.config)
    optimizer.load_state_dict(loaded.optimizer_states["critic"])  # ready to train on
    heads = loaded.shared_state["replay"]["heads"]
    assert heads.tolist() == list(result.state.replay.state()["heads"].tolist())
    assert int(heads.sum()) == loaded.env_steps  # a replay row per env step
    assert loaded.data["plugin_distribution"] is None  # registered in code by run_serial
    assert "sac" in repr(loaded) and "Pendulum-v1" in repr(loaded)


def test_load_takes_a_checkpoint_file_and_checks_the_env_given(sac_run):
    run_dir, _ = sac_run
    pm = plugin_manager(sac)
    file = run_dir / "checkpoints" / "last.pt"
    assert mprl.load(file, plugins=pm, env="Pendulum-v1").env_steps > 0
    with pytest.raises(UsageError, match=r"was trained on 'Pendulum-v1', not 'CartPole-v1'"):
        mprl.load(file, plugins=pm, env="CartPole-v1")


def test_a_checkpoint_of_a_plugin_not_installed_names_the_plugin_and_its_distribution(
    sac_run, tmp_path
):
    run_dir, _ = sac_run
    data = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    data.update(plugin="sac", plugin_distribution="mprl-sac-extra", plugin_version="1.2.3")
    file = tmp_path / "other.pt"
    torch.save(data, file)
    with pytest.raises(UsageError) as err:
        mprl.load(file, plugins=plugin_manager())  # mprl's built-ins only: no sac
    message = str(err.value)
    assert f"checkpoint {str(file)!r}" in message
    assert "algorithm 'sac' of plugin 'sac' (distribution 'mprl-sac-extra' 1.2.3)" in message
    assert "must be installed to load it" in message and "unknown plugin/algorithm" in message


def test_foreign_truncated_or_mismatched_files_are_errors_naming_the_file(sac_run, tmp_path):
    run_dir, _ = sac_run
    good = (run_dir / "checkpoints" / "last.pt").read_bytes()
    pm = plugin_manager(sac)
    cases = {
        "truncated.pt": (good[: len(good) // 2], "is truncated or corrupt"),
        "empty.pt": (b"", "is truncated or corrupt"),
        "text.pt": (b"hello", "is truncated or corrupt"),
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(UsageError, match=message) as err:
            mprl.load(tmp_path / name, plugins=pm)
        assert str(tmp_path / name) in str(err.value)
    torch.save({"weights": torch.zeros(3)}, tmp_path / "foreign.pt")
    with pytest.raises(UsageError, match="is not an mprl checkpoint") as err:
        mprl.load(tmp_path / "foreign.pt", plugins=pm)
    assert str(tmp_path / "foreign.pt") in str(err.value)
    with pytest.raises(UsageError, match="no checkpoint at"):
        mprl.load(tmp_path, plugins=pm)  # a directory without checkpoints/last.pt
    data = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    data["config"]["hidden"] = [8]  # the model rebuilt with this config cannot take the weights
    torch.save(data, tmp_path / "other-config.pt")
    with pytest.raises(UsageError, match=r"its model does not fit algorithm 'sac' \(") as err:
        mprl.load(tmp_path / "other-config.pt", plugins=pm)
    assert str(tmp_path / "other-config.pt") in str(err.value)


def test_a_format_1_checkpoint_of_mprl_0_1_0_loads(sac_run, tmp_path):
    run_dir, result = sac_run
    data = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    data.update(version=1, mprl_version="0.1.0")
    del data["optimizers"], data["plugin_distribution"]  # 0.1.0 had neither
    data["extra_state"] = {"weights": data["shared_state"].pop("weights")}  # kept apart then
    torch.save(data, tmp_path / "old.pt")
    loaded = mprl.load(tmp_path / "old.pt", plugins=plugin_manager(sac))
    assert (loaded.format_version, loaded.mprl_version) == (1, "0.1.0")
    assert loaded.optimizer_states == {}  # the named optimizers start fresh
    assert loaded.shared_state["weights"] == {"version": result.state.weights.version}
    trained = result.model.state_dict()
    assert all(torch.equal(v, trained[k]) for k, v in loaded.model.state_dict().items())


def test_a_model_without_act_loads_and_says_so_when_asked_to_act(tmp_path):
    pm = plugin_manager(mprl_testplugin)
    run_serial("probe", plugins=pm, run_dir=tmp_path / "probe", total_steps=20)
    loaded = mprl.load(tmp_path / "probe", plugins=pm)
    assert not loaded.model.training and loaded.optimizer_state is not None  # make_optimizer's
    assert {"visits", "envs", "seen"} <= set(loaded.shared_state)
    with pytest.raises(TypeError, match=r"'probe': its model \(ProbeModel\) has no act"):
        loaded.act(np.zeros((1, 1), np.float32))


# -- the format, documented --------------------------------------------------------------------

REFERENCE = REPO / "docs" / "reference.md"


def documented_keys() -> dict[str, str]:
    """The keys of docs/reference.md's checkpoint table, each with its "since" cell."""
    text = REFERENCE.read_text()
    start = text.index("### The checkpoint file")
    table = text[start : text.index("\n\n", text.index("| key |", start))]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    return {re.match(r"\| `(\w+)`", row)[1]: row.split("|")[3].strip() for row in rows}


def written_keys() -> set[str]:
    model = torch.nn.Linear(1, 1)
    data = checkpoint.payload(
        plugin="p", plugin_version="1", algorithm="a", config={}, run={}, session=0,
        model=model, optimizer=None, optimizers={}, steps=[0, 0, 0], shared_state={},
        stats={"episodes": 0, "returns": [], "best_return": 0.0, "wall_s": 0.0},
    )  # fmt: skip
    return set(data)


def test_the_documented_checkpoint_keys_are_those_mprl_writes():
    documented = documented_keys()
    assert set(documented) == written_keys()
    assert set(checkpoint.FIELDS) <= set(documented)  # the required ones are documented too
    versions = {int(v) for v in documented.values()}  # the format version that added each key
    assert versions <= set(range(1, checkpoint.VERSION + 1)) and max(versions) <= checkpoint.VERSION
    text = REFERENCE.read_text()
    assert f"`version` {checkpoint.VERSION}" in text  # the current version is the one stated
    for key in (*checkpoint.STATS, *checkpoint.RNG):  # the nested keys a checkpoint must have
        assert f"`{key}`" in text
