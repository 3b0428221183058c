"""``mprl export`` without a process: every built-in model's ``export_policy()`` written as
TorchScript and ONNX, read back and played against its ``act(obs, deterministic=True)`` (flat
and image observations, Discrete and Box actions, observation normalisation, gSDE, LSTM and GRU
cores, several agents); what the files say of themselves; a wrong export caught before anything
is written; and the command's refusals, each one line with exit 2."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import mprl
from mprl.errors import UsageError
from mprl.lib.nets import ActorCritic
from mprl.lib.recurrent import RecurrentActorCritic
from mprl.spaces import AgentBox
from mprl.testing import plugin_manager, run_serial
from mprl.tools.cli import main
from mprl_builtin import a3c, dqn, mappo, sac
from mprl_builtin.export import ExportFailed, export_run, formats
from mprl_builtin.export.policy import check, policy_of
from mprl_builtin.mappo.recurrent import RecurrentAgentsModel
from tests.conftest import cli_here

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

FLAT = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
IMAGE = gym.spaces.Box(0, 255, (44, 44, 3), np.uint8)  # HxWxC, small enough to trace fast
BOX = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))
AGENTS = AgentBox(["a", "b", "c"], [5, 5, 4], gym.spaces.Box(-1.0, 1.0, (7,), np.float32))


def checkpoint_of(model: torch.nn.Module, obs_space: gym.Space, act_space: gym.Space):
    """A :class:`mprl.Checkpoint` of ``model`` as ``mprl.load`` would give it."""
    return mprl.Checkpoint(
        path=Path("last.pt"), algorithm="test", plugin="tests", plugin_version="0", spec=None,
        config=None, run=mprl.RunConfig(env="Test-v0"), model=model.eval(),
        observation_space=obs_space, action_space=act_space, optimizer_state=None,
        optimizer_states={}, shared_state={}, env_steps=0, episodes=0, session=0,
        format_version=1, mprl_version="", data={},
    )  # fmt: skip


def shaken(model: torch.nn.Module, obs_space: gym.Space) -> torch.nn.Module:
    """``model`` with weights far from their initialisation (logits that differ, means away
    from the bounds' middle) and, where it normalises observations, statistics seen."""
    torch.manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.3)
    if getattr(model, "obs_norm", None) is not None:
        obs_space.seed(0)
        model.observe(torch.as_tensor(np.stack([obs_space.sample() * 3 + 1 for _ in range(64)])))
    return model


def agents_model(act_space: gym.Space, **config) -> tuple[torch.nn.Module, gym.Space]:
    cls = mappo.IPPOConfig if config.pop("ippo", False) else mappo.MAPPOConfig
    return mappo.algorithm.make_model(AGENTS, act_space, cls(hidden=(16,), **config)), AGENTS


AGENT_BOX = gym.spaces.Box(-1.0, 1.0, (3, 2), np.float32)
AGENT_CHOICES = gym.spaces.MultiDiscrete([5, 5, 5])
UNLIKE_CHOICES = gym.spaces.MultiDiscrete([2, 5, 3])  # agents with different action counts
MODELS = {
    "actor-critic": lambda: (ActorCritic(FLAT, gym.spaces.Discrete(3), (16,)), FLAT),
    "actor-critic-box-norm-sde": lambda: (
        ActorCritic(FLAT, BOX, (16, 16), normalize_obs=True, sde_every=4),
        FLAT,
    ),
    "actor-critic-nature": lambda: (ActorCritic(IMAGE, gym.spaces.Discrete(5), ()), IMAGE),
    "actor-critic-impala-box": lambda: (ActorCritic(IMAGE, BOX, (), torso="impala"), IMAGE),
    "lstm": lambda: (RecurrentActorCritic(FLAT, gym.spaces.Discrete(3), (16,), "lstm", 8), FLAT),
    "gru-box-norm": lambda: (
        RecurrentActorCritic(FLAT, BOX, (16,), "gru", 8, normalize_obs=True),
        FLAT,
    ),
    "lstm-nature": lambda: (
        RecurrentActorCritic(IMAGE, gym.spaces.Discrete(4), (), "lstm", 8),
        IMAGE,
    ),
    "dqn": lambda: (dqn.algorithm.make_model(FLAT, gym.spaces.Discrete(3), dqn.DQNConfig()), FLAT),
    "sac": lambda: (sac.algorithm.make_model(FLAT, BOX, sac.SACConfig(hidden=(16, 16))), FLAT),
    "mappo": lambda: agents_model(AGENT_CHOICES),
    "mappo-unlike-actions": lambda: agents_model(UNLIKE_CHOICES),
    "mappo-groups": lambda: agents_model(UNLIKE_CHOICES, groups="x:c;y:a,b"),
    "rmappo-lstm-groups": lambda: agents_model(
        AGENT_CHOICES, groups="x:b;y:c,a", core="lstm", core_size=8
    ),
    "ippo-box-own-nets": lambda: agents_model(AGENT_BOX, ippo=True, share_params=False),
    "rmappo-lstm": lambda: agents_model(AGENT_CHOICES, core="lstm", core_size=8),
    "rmappo-gru-unlike-actions-own-nets": lambda: agents_model(
        UNLIKE_CHOICES, core="gru", core_size=8, share_params=False
    ),
    "rmappo-gru-box-own-nets": lambda: agents_model(
        AGENT_BOX, core="gru", core_size=8, share_params=False
    ),
}


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
@pytest.mark.parametrize("name", MODELS)
def test_every_builtin_model_exports_the_actions_act_plays_deterministically(name, fmt, tmp_path):
    model, obs_space = MODELS[name]()
    ckpt = checkpoint_of(shaken(model, obs_space), obs_space, None)
    policy = policy_of(ckpt)
    path = tmp_path / f"policy{formats.SUFFIXES[fmt]}"
    formats.write(policy, fmt, path)
    said = check(policy, formats.runner(fmt, path))  # raises where an action differs
    recurrent = isinstance(model, RecurrentActorCritic | RecurrentAgentsModel)
    assert ("the state carried" in said) == recurrent == bool(policy.state_shapes)
    assert policy.inputs[0].name == "obs" and policy.outputs[0].name == "action"
    assert all(t.shape[0] == "batch" for t in (*policy.inputs, *policy.outputs))


def test_a_recurrent_export_names_its_state_and_an_lstm_has_h_and_c():
    lstm = policy_of(checkpoint_of(MODELS["lstm"]()[0], FLAT, None))
    assert lstm.state_shapes == {"h": (8,), "c": (8,)}
    assert [str(t) for t in lstm.inputs] == [
        "obs [batch, 4] float32", "h [batch, 8] float32", "c [batch, 8] float32",
    ]  # fmt: skip
    assert [str(t) for t in lstm.outputs] == [
        "action [batch] int64", "next_h [batch, 8] float32", "next_c [batch, 8] float32",
    ]  # fmt: skip
    gru = policy_of(checkpoint_of(MODELS["rmappo-gru-box-own-nets"]()[0], AGENTS, None))
    assert gru.state_shapes == {"h": (3, 8)}
    assert [str(t) for t in gru.outputs] == [
        "action [batch, 3, 2] float32", "next_h [batch, 3, 8] float32",
    ]  # fmt: skip


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_the_files_say_what_they_hold_and_take_any_batch_size(tmp_path):
    model, _ = MODELS["lstm"]()
    policy = policy_of(checkpoint_of(model, FLAT, gym.spaces.Discrete(3)))
    formats.write(policy, "torchscript", tmp_path / "p.pt")
    formats.write(policy, "onnx", tmp_path / "p.onnx")
    extra = {formats.METADATA_FILE: ""}
    loaded = torch.jit.load(str(tmp_path / "p.pt"), _extra_files=extra)
    said = json.loads(extra[formats.METADATA_FILE])
    assert said["format"] == "mprl-policy" and said["algorithm"] == "test"
    assert said["state"] == {"h": [8], "c": [8]} and said["initial_state"] == "zeros"
    assert [i["name"] for i in said["inputs"]] == ["obs", "h", "c"]
    graph = onnx.load(str(tmp_path / "p.onnx"))
    props = {p.key: p.value for p in graph.metadata_props}
    assert json.loads(props[formats.METADATA_KEY]) == said
    shapes = {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*graph.graph.input, *graph.graph.output]
    }
    assert shapes == {
        "obs": ["batch", 4], "h": ["batch", 8], "c": ["batch", 8],
        "action": ["batch"], "next_h": ["batch", 8], "next_c": ["batch", 8],
    }  # fmt: skip
    run = formats.runner("onnx", tmp_path / "p.onnx")
    for batch in (1, 13):
        obs = torch.randn(batch, 4)
        zeros = torch.zeros(batch, 8)
        traced = [o.numpy() for o in loaded(obs, zeros, zeros)]
        for mine, theirs in zip(
            traced, run(obs.numpy(), zeros.numpy(), zeros.numpy()), strict=True
        ):
            assert mine.shape == theirs.shape and mine.shape[0] == batch
            np.testing.assert_allclose(mine, theirs, atol=1e-5)


@pytest.fixture(scope="module")
def a3c_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real serial a3c run on CartPole: a run directory with a checkpoint."""
    run_dir = tmp_path_factory.mktemp("export") / "a3c"
    run_serial("a3c", plugins=[a3c], run_dir=run_dir, total_steps=100, workers=1,
               config={"envs_per_worker": 2, "hidden": [8]})  # fmt: skip
    return run_dir


class _Argmin(torch.nn.Module):
    def __init__(self, model: ActorCritic) -> None:
        super().__init__()
        self.net = model.pi

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).argmin(-1)


@pytest.mark.parametrize(
    ("export", "error"),
    [
        (lambda self: _Argmin(self), r"its export_policy\(\) does not compute what act\(\) does"),
        (lambda self: 1 / 0, r"export_policy\(\) raised ZeroDivisionError: division by zero"),
        (lambda self: "policy", r"export_policy\(\) returned str, not a torch.nn.Module"),
    ],
)
def test_a_wrong_export_is_one_line_exit_1_and_writes_nothing(
    a3c_run, export, error, monkeypatch, capsys
):
    monkeypatch.setattr(ActorCritic, "export_policy", export)
    pm = plugin_manager(a3c)
    with pytest.raises(ExportFailed, match=r"^algorithm 'a3c' of plugin 'mprl_builtin.a3c': "):
        export_run(a3c_run, a3c_run / "p.onnx", plugins=pm)
    code, err = cli_here(capsys, "export", str(a3c_run), "-o", str(a3c_run / "p.pt"))
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("mprl: error: algorithm 'a3c' of plugin 'a3c': ")
    assert err.rstrip().endswith("; nothing was written") and "Traceback" not in err
    assert re.search(error, err), err
    assert not list(a3c_run.glob("p.*")) and not list(a3c_run.glob(".p.*"))  # no temp file


def test_a_model_without_export_policy_is_refused_naming_the_plugin_and_what_it_needs(
    a3c_run, monkeypatch, capsys
):
    monkeypatch.delattr(ActorCritic, "export_policy")
    code, err = cli_here(capsys, "export", str(a3c_run))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.strip() == (
        "mprl: error: algorithm 'a3c' of plugin 'a3c' cannot be exported: its model "
        "(ActorCritic) has no export_policy() method; the plugin would need a method "
        "export_policy() on its model that returns a torch.nn.Module computing "
        "act(obs, deterministic=True) in tensor operations (docs/export.md)"
    )
    assert not (a3c_run / "policy.pt").exists()


def test_the_command_refuses_what_it_cannot_do_in_one_line_with_exit_2(a3c_run, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "started" / "checkpoints").mkdir(parents=True)
    (tmp_path / "started" / "config.json").write_text("{}")
    existing = tmp_path / "there.pt"
    existing.write_bytes(b"keep me")
    cases = {
        (str(tmp_path / "nope"),): "does not exist: give a run directory or a checkpoint file",
        (str(tmp_path / "empty"),): "is not a run directory: it has no config.json and no "
        "checkpoints/",
        (str(tmp_path / "started"),): "no checkpoint at ",
        (str(a3c_run), "-o", str(existing)): "there.pt' exists; give --force to overwrite it",
        (str(a3c_run), "-o", str(tmp_path / "no" / "p.pt")): "/no' does not exist",
        (str(a3c_run), "-o", str(tmp_path)): "it is a directory",
        (str(a3c_run), "-o", str(tmp_path / "p.onnx"), "--format", "torchscript"): "names a onnx "
        "file, and --format is torchscript: give -o FILE.pt or --format onnx",
        (str(a3c_run), "--format", "tflite"): "invalid choice: 'tflite'",
    }  # fmt: skip
    for args, error in cases.items():
        code, err = cli_here(capsys, "export", *args)
        assert code == 2, (args, err)
        last = err.strip().splitlines()[-1]  # argparse prints the usage first
        assert last.startswith("mprl: error: ") and error in last, (args, err)
    assert existing.read_bytes() == b"keep me"
    assert not list(tmp_path.rglob("*.tmp")) and not (a3c_run / "policy.pt").exists()


def test_the_command_says_what_it_wrote_and_force_overwrites(a3c_run, tmp_path, capsys):
    out = tmp_path / "cartpole.onnx"
    assert main(["export", str(a3c_run), "-o", str(out)]) == 0  # the format from the suffix
    lines = capsys.readouterr().out.splitlines()
    size = out.stat().st_size
    assert (
        lines[0].startswith(f"mprl: wrote {out} (ONNX opset 17, ")
        and "a3c on CartPole-v1" in lines[0]
    )
    assert lines[1].split() == ["inputs:", "obs", "[batch,", "4]", "float32"]
    assert lines[2].split() == ["outputs:", "action", "[batch]", "int64"]
    assert lines[3].startswith("  checked: the same actions as act(obs, deterministic=True) on")
    assert main(["export", str(a3c_run), "-o", str(out)]) == 2
    assert main(["export", str(a3c_run), "-o", str(out), "--force", "--format", "onnx"]) == 0
    assert out.stat().st_size == size
    assert main(["export", str(a3c_run / "checkpoints" / "last.pt")]) == 0  # beside the run
    assert "TorchScript" in capsys.readouterr().out and (a3c_run / "policy.pt").is_file()
    (a3c_run / "policy.pt").unlink()


def test_onnx_without_its_packages_says_what_to_install_or_what_was_not_checked(
    a3c_run, tmp_path, monkeypatch
):
    pm = plugin_manager(a3c)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # written, but not played back
    done = export_run(a3c_run, tmp_path / "p.onnx", plugins=pm)
    assert done.checked == 'not checked: onnxruntime is not installed (pip install "mprl[onnx]")'
    assert done.path.is_file() and done.kind == "ONNX opset 17"
    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(
        UsageError, match=r'^--format onnx needs the onnx package: pip install "mprl\[onnx\]"$'
    ):
        export_run(a3c_run, tmp_path / "q.onnx", plugins=pm)
    assert not list(tmp_path.glob("*q.onnx*"))
