"""The promise to 0.1.0's users (mprl/deprecated.py): every name a plugin, a test or a user could
import from mprl 0.1.0 still imports from where it was, with a warning naming its new place, or
says what replaced it; an ``mprl_make_backend`` hookimpl is still asked for a backend."""

from __future__ import annotations

import importlib
import re
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import mprl
from mprl import deprecated
from mprl.backends.base import Backend
from mprl.backends.local import LocalBackend
from mprl.backends.serial import SerialBackend
from mprl.deprecated import MprlDeprecationWarning
from mprl.errors import PluginError, UsageError
from mprl.host.plugins import BLOCK_ENV, get_plugin_manager
from mprl.testing import plugin_manager
from tests.conftest import REPO

API_0_1_0 = [
    tuple(line.split())
    for line in (REPO / "tests" / "compat" / "api-0.1.0.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]


def test_the_list_of_0_1_0_names_is_the_release() -> None:
    modules = {m for m, _ in API_0_1_0}
    assert len(API_0_1_0) > 150 and len(modules) == 25  # mprl/*.py of 0.1.0
    assert ("mprl.plugins", "PluginManager") in API_0_1_0
    assert ("mprl.transport", "Rollouts") in API_0_1_0 and ("mprl", "run") in API_0_1_0


@pytest.mark.parametrize(("module", "name"), API_0_1_0, ids=".".join)
def test_every_0_1_0_name_still_imports_from_where_it_was_or_says_what_replaced_it(
    module: str, name: str
) -> None:
    old = f"{module}.{name}"
    imported = importlib.import_module(module)  # importing an old module warns of nothing
    if old in deprecated.REMOVED:
        with pytest.raises(AttributeError) as error:
            getattr(imported, name)
        assert str(error.value) == f"{old} was removed in mprl 0.2.0: {deprecated.REMOVED[old]}"
        return
    if name not in deprecated.MOVED.get(module, {}):  # where it was: no warning
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            getattr(imported, name)
        return
    new = deprecated.MOVED[module][name]
    with pytest.warns(MprlDeprecationWarning) as caught:
        found = getattr(imported, name)
    (warning,) = caught
    message = str(warning.message)
    assert message.startswith(f"{old} is deprecated: use {new.replace(':', '.')} instead")
    assert message.endswith(f"{old} goes away in mprl 0.3.0")
    assert warning.filename == __file__  # it points at the line that used the old name
    assert found is deprecated.resolve(new)
    assert isinstance(warning.message, DeprecationWarning)


def test_the_tables_hold_only_0_1_0_names_and_every_gone_module() -> None:
    released = {f"{m}.{n}" for m, n in API_0_1_0}
    moved = {f"{m}.{n}" for m, names in deprecated.MOVED.items() for n in names}
    assert moved <= released and set(deprecated.REMOVED) <= released
    assert not moved & set(deprecated.REMOVED)
    assert set(deprecated.NOTES) <= moved
    # a module of 0.1.0 with no file now is made by the finder; the others are real
    gone = {
        m for m, _ in API_0_1_0
        if not (REPO / f"{m.replace('.', '/')}.py").exists()
        and not (REPO / m.replace(".", "/") / "__init__.py").exists()
    }  # fmt: skip
    assert gone == set(deprecated.OLD_MODULES)
    for module in gone:
        assert deprecated.MOVED[module], module


def test_an_old_import_warns_at_the_line_that_wrote_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "old_style_plugin.py").write_text(
        textwrap.dedent("""\
            import mprl.nets
            from mprl.plugins import PluginManager, get_plugin_manager

            BATCH = mprl.nets.EnvBatch
        """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(MprlDeprecationWarning) as caught:
        module = importlib.import_module("old_style_plugin")
    monkeypatch.delitem(sys.modules, "old_style_plugin")
    where = [(Path(w.filename).name, w.lineno, str(w.message).split(" is ")[0]) for w in caught]
    assert where == [
        ("old_style_plugin.py", 2, "mprl.plugins.PluginManager"),
        ("old_style_plugin.py", 2, "mprl.plugins.get_plugin_manager"),
        ("old_style_plugin.py", 4, "mprl.nets.EnvBatch"),
    ]
    from mprl.host.plugins import PluginManager
    from mprl.lib.envbatch import EnvBatch

    assert module.PluginManager is PluginManager and module.BATCH is EnvBatch


def test_a_gone_module_lists_its_names_and_says_where_they_went() -> None:
    nets = importlib.import_module("mprl.nets")
    assert dir(nets) == sorted(deprecated.MOVED["mprl.nets"]) == nets.__all__
    assert "mprl.lib.nets, mprl.lib.envbatch" in (nets.__doc__ or "")
    assert "0.3.0" in (nets.__doc__ or "")
    namespace: dict[str, object] = {}
    with pytest.warns(MprlDeprecationWarning):
        exec("from mprl.nets import *", namespace)
    assert {n for n in namespace if not n.startswith("__")} == set(deprecated.MOVED["mprl.nets"])
    with pytest.raises(AttributeError, match=r"module 'mprl\.nets' has no attribute 'nope'"):
        nets.nope  # noqa: B018
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("mprl.no_such_module")


def test_the_package_reaches_the_gone_modules_as_0_1_0_did() -> None:
    # 0.1.0's `import mprl` imported the runner and everything it used
    assert mprl.__getattr__("runner") is importlib.import_module("mprl.runner")
    with pytest.warns(MprlDeprecationWarning, match=r"use mprl\.RunConfig instead"):
        assert mprl.runner.RunConfig is mprl.RunConfig
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        mprl.__getattr__("nothing")


def test_the_finder_is_installed_once_and_last() -> None:
    finders = [f for f in sys.meta_path if getattr(f, "mprl_old_modules", False)]
    deprecated.install()
    assert [f for f in sys.meta_path if getattr(f, "mprl_old_modules", False)] == finders
    (finder,) = finders
    # a real module is found before it: it answers only for the gone ones
    assert sys.meta_path.index(finder) > 0
    assert finder.find_spec("mprl.schema") is None and finder.find_spec("mprl.plugins")


# -- the mprl_make_backend hook ----------------------------------------------------------------


class LegacyBackends:
    """A 0.1.0 plugin's backend hook: a serial backend under another name, and a wrong type."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.made: list[SerialBackend] = []

    @mprl.hookimpl
    def mprl_make_backend(self, name: str) -> object:
        self.asked.append(name)
        if name == "legacy-serial":
            self.made.append(SerialBackend())
            return self.made[-1]
        return "not a backend" if name == "legacy-wrong" else None


def test_an_mprl_make_backend_hookimpl_warns_naming_mprl_register_backends() -> None:
    pm = plugin_manager()
    with pytest.warns(MprlDeprecationWarning) as caught:
        pm.register(LegacyBackends(), name="legacy")
    (warning,) = caught
    assert str(warning.message).startswith(
        "the mprl_make_backend hook is deprecated: implement mprl_register_backends(register)"
    )
    assert "0.3.0" in str(warning.message)
    # pluggy points it at the hookimpl, the code to change
    assert (warning.filename, warning.lineno) == (
        __file__,
        LegacyBackends.mprl_make_backend.__code__.co_firstlineno,
    )


def test_an_mprl_make_backend_hookimpl_is_asked_for_names_no_plugin_registered() -> None:
    pm = plugin_manager()
    legacy = LegacyBackends()
    with pytest.warns(MprlDeprecationWarning):
        pm.register(legacy, name="legacy")
    assert isinstance(pm.backend("serial"), SerialBackend)  # a registered name: not asked
    assert isinstance(pm.backend("local"), LocalBackend) and legacy.asked == []
    backend = pm.backend("legacy-serial")
    assert legacy.asked == ["legacy-serial"] and backend is legacy.made[-1]
    with pytest.raises(UsageError, match=r"no plugin provides backend 'nope'; available: .*serial"):
        pm.backend("nope")
    assert legacy.asked == ["legacy-serial", "nope"]
    with pytest.raises(PluginError, match=r"plugin 'legacy': backend 'legacy-wrong' is a str"):
        pm.backend("legacy-wrong")


def test_a_run_goes_to_the_backend_an_mprl_make_backend_hookimpl_makes(tmp_path: Path) -> None:
    pm = plugin_manager(importlib.import_module("mprl_builtin.a3c"))
    legacy = LegacyBackends()
    with pytest.warns(MprlDeprecationWarning):
        pm.register(legacy, name="legacy")
    summary = mprl.run(
        "a3c", plugins=pm, backend="legacy-serial", total_steps=300, run_dir=tmp_path / "run",
        progress="none",
    )  # fmt: skip
    assert summary.status == "finished" and summary.env_steps >= 300
    (backend,) = legacy.made
    assert backend.job is not None and backend.contexts  # the run's processes ran in it


# the hook's example in 0.1.0's docs/hooks.md, as a plugin copied it
DOCUMENTED_0_1_0 = """\
import mprl
from mprl.local import LocalBackend


@mprl.hookimpl
def mprl_make_backend(name):
    if name == "local-debug":  # the local backend under another name
        return LocalBackend()
    return None
"""


def test_the_0_1_0_documented_backend_plugin_still_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "local_debug_0_1_0.py").write_text(DOCUMENTED_0_1_0)
    monkeypatch.syspath_prepend(str(tmp_path))
    pm = plugin_manager()
    with pytest.warns(MprlDeprecationWarning) as caught:
        module = importlib.import_module("local_debug_0_1_0")
        pm.register(module)
    monkeypatch.delitem(sys.modules, "local_debug_0_1_0")
    assert [str(w.message).split(" ")[:2] for w in caught] == [
        ["mprl.local.LocalBackend", "is"],
        ["the", "mprl_make_backend"],
    ]
    backend = pm.backend("local-debug")
    assert type(backend) is LocalBackend and isinstance(backend, Backend)


# -- the built-in plugins' old module names ----------------------------------------------------


def _forget(old: str) -> dict[str, ModuleType]:
    """Take ``old`` and its submodules out of ``sys.modules``; what was there."""
    return {
        name: sys.modules.pop(name)
        for name in list(sys.modules)
        if name == old or name.startswith(f"{old}.")
    }


@pytest.fixture
def forget_mprl_dqn() -> Iterator[None]:
    """``mprl_dqn`` as never imported during the test, and what it was again after it."""
    saved = _forget("mprl_dqn")
    yield
    _forget("mprl_dqn")
    sys.modules.update(saved)


@pytest.mark.parametrize("old", sorted(deprecated.MOVED_PLUGIN_MODULES))
def test_a_built_in_plugin_s_old_module_name_is_its_new_module_with_a_warning(old: str) -> None:
    saved = _forget(old)
    new = deprecated.MOVED_PLUGIN_MODULES[old]
    try:
        with pytest.warns(MprlDeprecationWarning) as caught:
            module = importlib.import_module(old)
        for name, sub in sys.modules.items():  # no module is loaded twice under the old name
            if name.startswith(f"{old}."):
                assert sub is sys.modules[name.replace(old, new, 1)]
    finally:
        _forget(old)
        sys.modules.update(saved)
    assert module is importlib.import_module(new)
    (warning,) = caught
    assert str(warning.message) == (
        f"module {old} is deprecated: use {new} instead (the built-in plugins moved under "
        f"mprl_builtin); {old} goes away in mprl 0.3.0"
    )


def test_the_old_module_names_of_a_plugin_s_parts_are_the_new_ones(forget_mprl_dqn: None) -> None:
    import mprl_builtin.dqn.algorithm

    with pytest.warns(MprlDeprecationWarning, match="module mprl_dqn is deprecated") as caught:
        from mprl_dqn.algorithm import DQNConfig  # type: ignore[import-not-found]
    assert DQNConfig is mprl_builtin.dqn.algorithm.DQNConfig  # one class, not a second copy
    assert len(caught) == 1 and caught[0].filename == __file__
    assert sys.modules["mprl_dqn.algorithm"] is mprl_builtin.dqn.algorithm


def test_an_installed_module_of_an_old_name_wins_with_no_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forget_mprl_dqn: None
) -> None:
    """A third party's ``mprl_dqn`` (the name the docs tell authors to use) is never shadowed."""
    package = tmp_path / "mprl_dqn"
    package.mkdir()
    (package / "__init__.py").write_text("WHO = 'the third party'\n")
    (package / "algorithm.py").write_text("WHO = 'the third party, too'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module = importlib.import_module("mprl_dqn")
        algorithm = importlib.import_module("mprl_dqn.algorithm")
    assert module.WHO == "the third party" and module.__file__ == str(package / "__init__.py")
    assert algorithm.WHO == "the third party, too"


# -- plugin names ------------------------------------------------------------------------------


def test_blocking_the_0_1_0_builtin_plugin_blocks_what_it_became(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(BLOCK_ENV, "mprl.builtin")
    with pytest.warns(MprlDeprecationWarning, match=r"plugin name 'mprl.builtin' is deprecated"):
        pm = get_plugin_manager(autoload=False)
    became = ["mprl.environments", "mprl.backends.local", "mprl.backends.serial"]
    assert pm.blocked_names() == became  # what spawned children block: no warning there
    assert not any(pm.has_plugin(name) for name in became)
    assert "local" not in pm.backends() and "serial" not in pm.backends()
    assert re.search(r"mprl\.environments, mprl\.backends\.local, mprl\.backends\.serial", str(
        deprecated.renamed_plugin_message("mprl.builtin")
    ))  # fmt: skip


# -- where a user reads about it -----------------------------------------------------------------


def _section(text: str, title: str) -> str:
    return text.split(title, 1)[1].split("\n## ", 1)[0]


def test_the_reference_and_the_changelog_name_every_deprecation_and_removal() -> None:
    reference = _section((REPO / "docs" / "reference.md").read_text(), "## 11. Deprecated in 0.2.0")
    changelog = _section((REPO / "CHANGELOG.md").read_text(), f"## {mprl.__version__}")
    for old, names in deprecated.MOVED.items():  # the reference says where each name went
        for name, new in names.items():
            assert new.partition(":")[0] in reference, (old, name, new)
    for text in (reference, changelog):  # both say how to migrate what the user could notice
        for module in deprecated.OLD_MODULES:
            assert f"`{module}" in text or f" {module}" in text, module
        for old, names in deprecated.MOVED.items():
            for name, new in names.items():
                attribute = new.partition(":")[2]
                if attribute != name:  # renamed: both spellings are written down
                    assert name in text and attribute in text, (old, name, new)
        for old in deprecated.REMOVED:
            assert old.rsplit(".", 1)[1] in text, old
        assert "mprl_make_backend" in text and "mprl_register_backends" in text
        assert "mprl.builtin" in text and deprecated.REMOVED_IN in text


def test_the_version_is_the_changelog_s_newest_release() -> None:
    changelog = (REPO / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## (\d+\.\d+\.\d+)", changelog, flags=re.MULTILINE)
    assert releases[:2] == [mprl.__version__, "0.1.0"] and mprl.__version__ == "0.2.0"
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^version = "(.*)"$', pyproject, flags=re.MULTILINE)[1] == mprl.__version__
    newest = _section(changelog, f"## {mprl.__version__}")
    groups = re.findall(r"^### (\w+)", newest, flags=re.MULTILINE)
    assert [g for g in groups if g in ("Breaking", "Deprecated", "Changed", "Added")] == [
        "Breaking", "Deprecated", "Changed", "Added",
    ]  # fmt: skip
    assert deprecated.REMOVED_IN == "0.3.0"  # one minor release after the deprecation


def _moved_calls() -> dict[str, tuple[Any, Any]]:
    """Per method of :data:`mprl.deprecated.MOVED_METHODS`: its old call, its new one."""
    import gymnasium as gym
    import torch

    from mprl import kinds, schema
    from mprl.backends.inprocess import InProcessManager
    from mprl.transport.memory import MemoryBuilder

    replay = schema.ReplayBuffer(8, row={"x": ((2,), torch.float32)}, replay_ratio=2)
    fields = schema.Schema(replay=replay, turns=schema.PerWorker(0))
    dims = schema.Dims(2, gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2))
    model = torch.nn.Linear(3, 2)
    builder = MemoryBuilder(InProcessManager(), model, None, share=False, sleep=True)
    state = kinds.build(fields, builder, dims)
    saved, kept = kinds.snapshot(fields, state), kinds.of(replay).snapshot(replay, state.replay)
    handler = kinds.of(replay)
    return {
        "Field.build": (lambda: type(replay.build(builder, dims)),
                        lambda: type(handler.build(replay, builder, dims))),
        "Field.snapshot": (lambda: replay.snapshot(state.replay).keys(), lambda: kept.keys()),
        "Field.restore": (lambda: replay.restore(state.replay, kept),
                          lambda: handler.restore(replay, state.replay, kept)),
        "Field.fit": (lambda: replay.fit(kept, dims)[1], lambda: handler.fit(replay, kept, dims)[1]),
        "Field.memory": (lambda: replay.memory(dims), lambda: handler.memory(replay, dims)),
        "Field.check_dims": (lambda: replay.check_dims(dims), lambda: None),
        "Field.check": (lambda: replay.check(), lambda: None),
        "Field.needs_manager": (lambda: schema.PerWorker(0).needs_manager, lambda: True),
        "ReplayBuffer.pace": (lambda: replay.pace(dims), lambda: kinds.pace(replay, dims)),
        "Schema.build": (lambda: sorted(vars(fields.build(builder, dims))), lambda: sorted(vars(state))),
        "Schema.snapshot": (lambda: fields.snapshot(state).keys(), lambda: saved.keys()),
        "Schema.restore": (lambda: fields.restore(state, saved), lambda: []),
        "Schema.fit": (lambda: fields.fit(saved, dims).unfit, lambda: {}),
        "Schema.memory": (lambda: fields.memory(dims), lambda: kinds.memory(fields, dims)),
        "Schema.check_dims": (lambda: fields.check_dims(dims), lambda: None),
        "Schema.needs_manager": (lambda: fields.needs_manager(), lambda: True),
    }  # fmt: skip


@pytest.mark.parametrize("key", sorted(deprecated.MOVED_METHODS))
def test_what_a_declaration_did_at_run_time_still_works_with_a_warning(key: str) -> None:
    """Each method of a field or a schema that moved to mprl.kinds: the old call warns, naming
    the new one, and gives what the new one gives; a name that never was is no name."""
    from mprl import schema

    old, new = _moved_calls()[key]
    with pytest.warns(deprecated.MprlDeprecationWarning, match=f"mprl.schema.{key} is dep"):
        got = old()
    assert got == new()
    with pytest.raises(AttributeError, match="no attribute 'no_such_method'"):
        schema.ReplayBuffer(8).no_such_method  # noqa: B018
