"""The plugin author's docs stay honest: every hook spec documents what it takes and returns,
docs/hooks.md and docs/schema.md match the source, and each documented example works when a
plugin uses it as written."""

from __future__ import annotations

import argparse
import csv
import importlib
import importlib.util
import inspect
import re
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
import gymnasium as gym
import pytest

import mprl
from mprl import hookspecs, schema
from mprl.backends.local import LocalBackend
from mprl.context import Context, episode_record
from mprl.host.envs import EnvFactory, check_env, make_env, workload
from mprl.host.job import resolve
from mprl.host.plugins import NO_AUTOLOAD_ENV, PluginManager, get_plugin_manager
from mprl.run_types import RunInfo, Summary
from mprl.testing import build_state

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_PLUGIN = "docs-example"


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "mprl_docs_generate", REPO / "docs" / "generate.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = _load_generator()
SPECS = generate.hook_specs()
HOOKS = [spec.__name__ for spec in SPECS]


# -- (a) every hook spec documents itself completely -----------------------------------------


def docstring_problems(spec: Callable[..., Any]) -> list[str]:
    """What the docstring of hook spec ``spec`` lacks or gets wrong (empty: nothing)."""
    doc = inspect.getdoc(spec)
    if not doc:
        return ["no docstring"]
    try:
        parsed = generate.parse(doc)
    except ValueError as exc:
        return [str(exc)]
    params = list(inspect.signature(spec).parameters)
    problems = [f"no :param {p}:" for p in params if not parsed.params.get(p)]
    problems += [f":param {p}: is not a parameter" for p in parsed.params if p not in params]
    if not parsed.description:
        problems.append("no description")
    if not parsed.returns:
        problems.append("no :returns:")
    elif generate.is_firstresult(spec) != ("Not firstresult" not in parsed.returns):
        problems.append(":returns: says the opposite of the spec about firstresult")
    if not parsed.example:
        problems.append("no Example:: block")
    return problems


def test_the_hooks_are_found_in_source_order() -> None:
    source = inspect.getsource(hookspecs)
    defined = re.findall(r"^@hookspec.*\ndef (mprl_\w+)", source, flags=re.MULTILINE)
    assert defined == HOOKS
    assert "mprl_make_env" in HOOKS


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_spec_docstring_is_complete(hook: str) -> None:
    assert docstring_problems(getattr(hookspecs, hook)) == []


@mprl.hookspec(firstresult=True)
def _incomplete(env_id: str, seed: int) -> None:
    """Make something.

    :param env_id: the id.
    :param steps: no such parameter.
    """


@mprl.hookspec
def _undocumented(env_id: str) -> None:
    pass


@mprl.hookspec
def _contradicts(env_id: str) -> None:
    """Make something.

    :param env_id: the id.
    :returns: the first non-None value. firstresult.

    Example::

        print("hello")
    """


def test_docstring_problems_are_found() -> None:
    assert docstring_problems(_incomplete) == [
        "no :param seed:",
        ":param steps: is not a parameter",
        "no :returns:",
        "no Example:: block",
    ]
    assert docstring_problems(_undocumented) == ["no docstring"]
    assert docstring_problems(_contradicts) == [
        ":returns: says the opposite of the spec about firstresult"
    ]


def test_parse_splits_fields_and_dedents_the_example() -> None:
    doc = generate.parse(inspect.getdoc(_contradicts) or "")
    assert doc.description == "Make something."
    assert doc.params == {"env_id": "the id."}
    assert doc.returns == "the first non-None value. firstresult."
    assert doc.example == 'print("hello")'


# -- (b) the generated files match the source -------------------------------------------------


def test_checked_in_docs_are_up_to_date(capsys: pytest.CaptureFixture[str]) -> None:
    code = generate.main(["--check"])
    assert code == 0, f"{capsys.readouterr().err}(docs/*.md must be regenerated and committed)"


def test_check_names_the_stale_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(generate, "DOCS", tmp_path)
    assert generate.main([]) == 0
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == generate.render()
    assert generate.main(["--check"]) == 0

    hooks = tmp_path / "hooks.md"
    hooks.write_text(hooks.read_text().replace("firstresult:** yes", "firstresult:** no"))
    (tmp_path / "schema.md").unlink()
    assert generate.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert f"{hooks} is stale: run `python docs/generate.py`" in err
    assert f"{tmp_path / 'schema.md'} is stale" in err


def _sections(text: str, level: str) -> dict[str, str]:
    """``{title in backticks: body}`` for every heading of ``level`` (``##``, ``###``)."""
    parts = re.split(rf"^{level} `(\w+)`$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def _table_names(body: str) -> list[str]:
    return re.findall(r"^\| `(\w+)` \|", body, flags=re.MULTILINE)


def test_every_name_in_hooks_md_exists() -> None:
    text = (REPO / "docs" / "hooks.md").read_text()
    sections = _sections(text, "##")
    assert [title for title in sections if title.startswith("mprl_")] == HOOKS
    for hook in HOOKS:
        params = list(inspect.signature(getattr(hookspecs, hook)).parameters)
        assert _table_names(sections[hook]) == params, hook
    assert _table_names(sections["RunInfo"]) == [f.name for f in attrs.fields(RunInfo)]
    options = re.search(r"`mprl.RunConfig` of the run's other options: (.*)\.$", text, re.M)
    assert options is not None
    named = re.findall(r"`(\w+)`", options[1])
    assert named == [f.name for f in attrs.fields(mprl.RunConfig)]
    assert set(re.findall(r"\bmprl_[a-z_]+\b", text)) == set(HOOKS)


def test_every_name_in_schema_md_exists() -> None:
    sections = _sections((REPO / "docs" / "schema.md").read_text(), "###")
    protocols = [p.__name__ for p in generate.PROTOCOLS]
    assert list(sections) == [kind.__name__ for kind in schema.KINDS] + protocols
    # every public member of each transport protocol is documented, and nothing else
    for proto in generate.PROTOCOLS:
        members = [n for n in vars(proto) if not n.startswith("_") and n != "slots_per_worker"]
        assert re.findall(r"^- `(\w+)", sections[proto.__name__], re.M) == members
    for kind in schema.KINDS:
        assert _table_names(sections[kind.__name__]) == [f.name for f in attrs.fields(kind)]
        assert ("No parameters." in sections[kind.__name__]) == (not attrs.fields(kind))


# -- (c) every documented example works as written --------------------------------------------


@pytest.fixture
def load_example(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[str], tuple[PluginManager, ModuleType]]]:
    """Write hook ``hook``'s example to a module, import it, register it with a fresh manager."""
    names: list[str] = []

    def load(hook: str) -> tuple[PluginManager, ModuleType]:
        code = generate.parse(inspect.getdoc(getattr(hookspecs, hook)) or "").example
        assert code, f"{hook} has no Example:: block"
        name = f"mprl_docs_example_{hook}"
        (tmp_path / f"{name}.py").write_text(code + "\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        names.append(name)
        module = importlib.import_module(name)
        pm = get_plugin_manager(autoload=False)
        pm.register(module, name=EXAMPLE_PLUGIN)
        pm.check()  # a misspelt hook name fails here, a misspelt argument name in register()
        assert [i.plugin for i in getattr(pm.hook, hook).get_hookimpls()][-1] is module
        return pm, module

    yield load
    for name in names:
        sys.modules.pop(name, None)


def test_every_hook_has_an_example_test() -> None:
    assert [h for h in HOOKS if f"test_{h}_example" not in globals()] == []


@attrs.frozen
class ExampleConfig:
    lr: float = 0.01


def run_info(tmp_path: Path) -> RunInfo:
    """A run as the lifecycle hooks see it, its run directory empty."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return RunInfo(
        plugin=EXAMPLE_PLUGIN,
        plugin_version="0.1.0",
        algorithm="greedy",
        config=ExampleConfig(),
        run=mprl.RunConfig(env="CartPole-v1", workers=1),
        run_dir=run_dir,
        reward_threshold=475.0,
    )


class BudgetChannel:
    """A :class:`mprl.context.Channel` for one process in this one: stop after ``budget`` steps
    and keep every record sent."""

    def __init__(self, budget: int) -> None:
        self.budget, self.steps = budget, 0
        self.records: list[dict[str, Any]] = []

    def should_stop(self, slot: int) -> bool:
        return self.steps >= self.budget

    def add_steps(self, slot: int, n: int) -> None:
        self.steps += n

    def beat(self, slot: int, starting: bool = False) -> None:
        pass

    def env_steps(self) -> int:
        return self.steps

    def send(self, slot: int, record: dict[str, Any]) -> None:
        self.records.append(record)

    def episode(self, slot: int, source: str, episode_return: float, episode_length: int) -> None:
        self.send(slot, episode_record(source, self.steps, 0.0, episode_return, episode_length))

    def flush(self) -> None:
        pass


def test_mprl_register_algorithms_example(
    load_example: Callable[[str], tuple[PluginManager, ModuleType]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pm, _ = load_example("mprl_register_algorithms")
    [(name, (plugin, algo))] = pm.algorithms().items()  # Algorithm() checked every field
    assert (plugin, name) == (EXAMPLE_PLUGIN, algo.name)
    env = gym.make(algo.default_env)
    assert algo.supports(env.action_space)
    config = algo.config_cls()
    model = algo.make_model(env.observation_space, env.action_space, config)

    # the worker plays in a thread of this process, through a real Context, until the budget
    monkeypatch.setenv(NO_AUTOLOAD_ENV, "1")  # the env factory's manager: built-ins only
    channel = BudgetChannel(budget=300)
    ctx = Context(
        role="worker", rank=0, n_workers=1, seed=1, config=config,
        run=mprl.RunConfig(env=algo.default_env, workers=1), state=build_state(algo, 1),
        model=model, optimizer=None, channel=channel, make_env=EnvFactory(get_plugin_manager()),
    )  # fmt: skip
    errors: list[BaseException] = []

    def play() -> None:
        try:
            algo.worker(ctx)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=play, daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), "the example worker did not return once ctx.should_stop()"
    if errors:
        raise errors[0]
    episodes = [r for r in channel.records if "episode_return" in r]
    assert episodes and channel.steps >= channel.budget
    assert sum(r["episode_length"] for r in episodes) == channel.steps
    for r in episodes:  # CartPole: reward 1 per step
        assert (r["source"], r["episode_return"]) == ("worker:0", r["episode_length"])


def test_mprl_make_env_example(
    load_example: Callable[[str], tuple[PluginManager, ModuleType]],
) -> None:
    pm, module = load_example("mprl_make_env")
    env = make_env(pm, "CartPole-1000-v0", seed=3, rank=0, render_mode="rgb_array")
    assert isinstance(env, gym.Env)
    assert (env.spec.id, env.spec.max_episode_steps) == ("CartPole-v1", 1000)
    assert env.render_mode == "rgb_array"
    env.reset(seed=3)
    assert env.action_space.contains(env.action_space.sample())

    other = {"env_id": "CartPole-v1", "seed": 0, "rank": 0, "index": 0, "render_mode": None}
    assert pm.call_one("mprl_make_env", module, **other) is None
    assert make_env(pm, "CartPole-v1").spec.max_episode_steps == 500  # the built-in made it


def test_mprl_adapt_env_example(
    load_example: Callable[[str], tuple[PluginManager, ModuleType]],
) -> None:
    pm, module = load_example("mprl_adapt_env")
    env = make_env(pm, "Coin-v0")
    assert isinstance(env, module.CoinEnv)
    obs, _ = env.reset(seed=1)
    assert env.step(1)[:4] == (obs, 1.0, True, False) and env.step(0)[1] == 0.0
    assert isinstance(make_env(pm, "CartPole-v1").unwrapped, gym.Env)  # the built-in's ids
    assert pm.call_one("mprl_adapt_env", module, env=object(), env_id="x") is None


def test_mprl_check_env_example(
    load_example: Callable[[str], tuple[PluginManager, ModuleType]],
) -> None:
    pm, _ = load_example("mprl_check_env")
    check_env(pm, mprl.RunConfig(env="Corridor-v0", env_batch="gym"))
    with pytest.raises(mprl.errors.UsageError, match=r"--env-batch envpool: Corridor-v0 has no"):
        check_env(pm, mprl.RunConfig(env="Corridor-v0", env_batch="envpool"))


def test_mprl_env_workload_example(
    load_example: Callable[[str], tuple[PluginManager, ModuleType]],
) -> None:
    pm, _ = load_example("mprl_env_workload")
    assert workload(pm, "MyPong-v0") == "atari" and workload(pm, "HalfCheetah-v5") == "mujoco"
    pm.register(importlib.import_module("mprl_builtin.a3c"), name="a3c")
    _, algo, config, _ = resolve("a3c", pm, None, {"env": "MyPong-v0"})
    assert algo.presets["atari"] and config == algo.config_cls(**algo.presets["atari"])


def test_mprl_register_commands_example(
    load_example: Callable[[str], tuple[PluginManager, ModuleType]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    pm, _ = load_example("mprl_register_commands")
    pm.register(importlib.import_module("mprl_builtin.a3c"), name="a3c")
    info = pm.commands()["hello"]
    assert (info.plugin, info.help) == (EXAMPLE_PLUGIN, "greet an algorithm")
    parser = argparse.ArgumentParser()
    info.add_arguments(parser, pm)
    assert info.run(parser.parse_args(["a3c"]), pm) == 0
    assert capsys.readouterr().out == "hello, a3c of plugin a3c\n"


def test_mprl_register_backends_example(
    load_example: Callable[[str], tuple[PluginManager, ModuleType]],
) -> None:
    pm, module = load_example("mprl_register_backends")
    info = pm.backends()["quiet-local"]
    assert info.plugin == pm.get_name(module) and "saying how many" in info.description
    backend = pm.backend("quiet-local")
    assert isinstance(backend, LocalBackend) and backend is not pm.backend("quiet-local")
    assert {"local", "serial"} <= set(pm.backends())  # the built-ins are still there


def test_mprl_register_options_example(
    load_example: Callable[[str], tuple[PluginManager, ModuleType]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pm, module = load_example("mprl_register_options")
    options = pm.run_options()
    assert options.owners["slack_channel"] == pm.get_name(module)
    run = options.build({"slack_channel": "#runs", "workers": 2})
    assert run.workers == 2 and run.of(module.SlackOptions).slack_channel == "#runs"
    with pytest.raises(mprl.ConfigError, match="'slack_channel' expects str"):
        options.build({"slack_channel": 3})
    info = attrs.evolve(run_info(tmp_path), run=run)
    pm.hook.mprl_run_end(run=info, summary={"status": "finished"})
    assert "to #runs: greedy finished" in capsys.readouterr().out


def test_mprl_run_start_example(
    load_example: Callable[[str], tuple[PluginManager, ModuleType]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pm, _ = load_example("mprl_run_start")
    info = run_info(tmp_path)
    pm.hook.mprl_run_start(run=info)
    out = capsys.readouterr().out
    for expected in ("greedy", "CartPole-v1", "1 workers", str(info.run_dir)):
        assert expected in out


def test_mprl_report_metrics_example(
    load_example: Callable[[str], tuple[PluginManager, ModuleType]], tmp_path: Path
) -> None:
    pm, _ = load_example("mprl_report_metrics")
    info = run_info(tmp_path)
    pm.hook.mprl_report_metrics(
        run=info,
        records=[
            {"wall": 1.5, "step": 40, "source": "worker:0", "episode_return": 21.0,
             "episode_length": 21},
            {"wall": 1.6, "step": 48, "source": "trainer", "loss": 0.25},
        ],
    )  # fmt: skip
    pm.hook.mprl_report_metrics(
        run=info,
        records=[{"wall": 2.0, "step": 90, "source": "worker:1", "episode_return": 33.0,
                  "episode_length": 33}],
    )  # fmt: skip
    [written] = list(info.run_dir.iterdir())
    assert written.suffix == ".csv"
    with written.open(newline="") as f:
        rows = list(csv.reader(f))
    assert rows == [["40", "worker:0", "21.0"], ["90", "worker:1", "33.0"]]


def test_mprl_run_end_example(
    load_example: Callable[[str], tuple[PluginManager, ModuleType]], tmp_path: Path
) -> None:
    pm, _ = load_example("mprl_run_end")
    summary = Summary(
        status="finished", stop_reason="solved", solved=True, env_steps=52_000, episodes=310,
        wall_s=61.0, mean_return_100=480.5, best_return=500.0, run_dir=tmp_path,
        plugin=EXAMPLE_PLUGIN, algorithm="greedy", env="CartPole-v1",
    )  # fmt: skip
    info = run_info(tmp_path)
    pm.hook.mprl_run_end(run=info, summary=summary.to_dict())
    [written] = list(info.run_dir.iterdir())
    text = written.read_text()
    for expected in ("greedy", "finished", "480.5"):
        assert expected in text
