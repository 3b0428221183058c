"""The public API is a promise (docs/reference.md, "The public API"): its names and signatures are
snapshotted in tests/unit/public_api.txt, so that any change to them is a deliberate edit.

After a deliberate change, regenerate the snapshot and review its diff:

    MPRL_UPDATE_API_SNAPSHOT=1 python -m pytest tests/unit/test_public_api.py

A removed or renamed name also goes to mprl/deprecated.py (it keeps working for one minor
release, with a warning naming its new place), CHANGELOG.md and docs/reference.md.

What is snapshotted: every public name (no leading underscore) of :data:`MODULES` (``__all__``
where a module has one, else what the module defines), with functions' signatures, classes'
``__init__`` signatures, bases and public members (those of mprl's own classes in the MRO), hook
specs with their options, and constants with their values. Nothing here depends on how a class
is implemented inside (private names, attrs' private fields), so refactoring internals leaves
the snapshot alone.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import inspect
import os
import pkgutil
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
import pytest

import mprl.lib
from tests.conftest import REPO

SNAPSHOT = Path(__file__).with_name("public_api.txt")
UPDATE_ENV = "MPRL_UPDATE_API_SNAPSHOT"
REGENERATE = (
    f"{UPDATE_ENV}=1 python -m pytest {SNAPSHOT.parent.relative_to(REPO)}/test_public_api.py"
)

#: the modules plugins, tests and users may import, and the names of each that are public (None:
#: all of them)
MODULES: dict[str, tuple[str, ...] | None] = {
    "mprl": None,
    "mprl.errors": None,
    "mprl.schema": None,
    "mprl.spaces": None,
    "mprl.transport": None,
    "mprl.testing": None,
    **{f"mprl.lib.{m.name}": None for m in pkgutil.iter_modules(mprl.lib.__path__)},
    "mprl.hookspecs": None,
    "mprl.run_types": ("RunInfo",),  # what the lifecycle hooks receive
    "mprl.host.plugins": ("PluginManager", "get_plugin_manager"),  # the type of mprl_pm
    # the deprecations' warning class (for -W filters) and the deprecated hook; not the tables
    "mprl.deprecated": ("REMOVED_IN", "MprlDeprecationWarning", "mprl_make_backend"),
}
SIMPLE = (bool, int, float, str, type(None))


class _Text:
    """Shown as its text in a signature: annotations without quotes, defaults without addresses."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _clean(text: str) -> str:
    return re.sub(r" at 0x[0-9a-fA-F]+", "", text)


def signature(obj: Any, factories: frozenset[str] = frozenset()) -> str:
    """``(a: int, *, b: str = 'x') -> None``, annotations as written in the source."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"

    def text(annotation: Any) -> Any:
        if annotation is inspect.Parameter.empty:
            return annotation
        return _Text(
            annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
        )

    params = []
    for p in sig.parameters.values():
        default = p.default
        if p.name in factories:
            default = _Text("<factory>")
        elif default is not inspect.Parameter.empty:
            default = _Text(_clean(repr(default)))
        params.append(p.replace(annotation=text(p.annotation), default=default))
    return str(sig.replace(parameters=params, return_annotation=text(sig.return_annotation)))


def source_values(module: ModuleType) -> dict[str, str]:
    """``{name: expression}`` for each simple top-level ``name = expression`` of ``module``."""
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError):
        return {}
    found = {}
    for node in _top_level(tree.body):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    found[target.id] = ast.unparse(node.value)
    return found


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Top-level statements, with those under ``if``/``try`` (not ``if TYPE_CHECKING``)."""
    for node in body:
        if isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                yield from _top_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body + node.orelse + node.finalbody)
        else:
            yield node


def defined_names(module: ModuleType) -> list[str]:
    """The public names ``module`` exports: its ``__all__``, else those its source defines."""
    if hasattr(module, "__all__"):
        return sorted(module.__all__)
    tree = ast.parse(inspect.getsource(module))
    names = set()
    for node in _top_level(tree.body):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return sorted(n for n in names if not n.startswith("_"))


def value(name: str, obj: Any, sources: dict[str, str]) -> str:
    if name == "__version__":  # changes with every release, by design
        return f"{name}: str"
    if name in sources:
        return f"{name} = {sources[name]}"
    if isinstance(obj, SIMPLE):
        return f"{name} = {obj!r}"
    return f"{name}: {type(obj).__qualname__}"


def public_bases(cls: type) -> list[str]:
    """The names of ``cls``'s bases, a private base stood in for by its own public bases."""
    names: list[str] = []
    for base in cls.__bases__:
        if base is object:
            continue
        for name in public_bases(base) if base.__name__.startswith("_") else [_spelling(base)]:
            if name not in names:
                names.append(name)
    return names


def _spelling(cls: type) -> str:
    """``Field`` for mprl's own classes, ``Exception``, else the shortest import path
    (``torch.nn.Module``, ``pluggy.PluginManager``)."""
    if cls.__module__.startswith("mprl") or cls.__module__ == "builtins":
        return cls.__qualname__
    parts = cls.__module__.split(".")
    for n in range(1, len(parts) + 1):
        module = importlib.import_module(".".join(parts[:n]))
        if getattr(module, cls.__qualname__, None) is cls:
            return f"{module.__name__}.{cls.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def describe_class(cls: type) -> list[str]:
    bases = ", ".join(public_bases(cls))
    lines = [f"class {cls.__name__}({bases})" if bases else f"class {cls.__name__}"]
    factories = frozenset()
    if attrs.has(cls):
        fields = attrs.fields(cls)
        factories = frozenset(
            f.alias or f.name for f in fields if isinstance(f.default, attrs.Factory)
        )
    # members of mprl's classes in the MRO (which of them defines one is the implementation's
    # business); torch's, pluggy's and typing's members are theirs
    members: dict[str, Any] = {}
    for klass in cls.__mro__:
        if not klass.__module__.startswith("mprl"):
            continue
        for name, member in vars(klass).items():
            if name == "__init__" and not getattr(member, "__module__", "").startswith("mprl"):
                continue  # typing.Protocol's placeholder
            if (name == "__init__" or not name.startswith("_")) and name not in members:
                members[name] = member
        for name, annotation in vars(klass).get("__annotations__", {}).items():
            if not name.startswith("_") and name not in members:
                members[name] = _Text(f"annotation {annotation}")
    init_params = set(inspect.signature(cls).parameters) if "__init__" in members else set()
    for name in sorted(members, key=lambda n: (n != "__init__", n)):
        line = _member(cls, name, members[name], factories)
        if not (name in init_params and line.startswith("attribute")):
            lines.append(f"    {line}")
    return lines


def _member(cls: type, name: str, member: Any, factories: frozenset[str]) -> str:
    if name == "__init__":
        return f"__init__{signature(cls, factories)}"
    if isinstance(member, staticmethod | classmethod):
        kind = type(member).__name__
        return f"{kind} {name}{signature(getattr(cls, name))}"
    if isinstance(member, property):
        returns = inspect.signature(member.fget).return_annotation if member.fget else None
        settable = ", settable" if member.fset else ""
        return f"property {name}: {returns}{settable}"
    if inspect.isfunction(member):
        return f"def {name}{signature(member)}"
    if isinstance(member, type):
        return f"class {name}"
    if isinstance(member, _Text):  # an annotated name without a value in the class body
        return f"attribute {name}: {member.text.removeprefix('annotation ')}"
    if type(member).__name__ in ("member_descriptor", "getset_descriptor"):
        return f"attribute {name}"  # an attrs slot
    if isinstance(member, SIMPLE):
        return f"attribute {name} = {member!r}"
    return f"attribute {name}: {type(member).__qualname__}"


def describe(module_name: str, names: tuple[str, ...] | None) -> list[str]:
    module = importlib.import_module(module_name)
    sources = source_values(module)
    lines = [f"## {module_name}"]
    for name in names or defined_names(module):
        obj = getattr(module, name)
        if inspect.ismodule(obj):
            lines.append(f"module {name}: {obj.__name__}")
        elif isinstance(obj, type):
            lines += describe_class(obj)
        elif hasattr(obj, "mprl_spec"):
            options = {k: v for k, v in obj.mprl_spec.items() if v}
            flags = f"  {sorted(options)}" if options else ""
            lines.append(f"hook {name}{signature(obj)}{flags}")
        elif hasattr(obj, "_fixture_function_marker") or hasattr(obj, "_pytestfixturefunction"):
            lines.append(f"fixture {name}{signature(obj)}")
        elif inspect.isfunction(obj):
            lines.append(f"def {name}{signature(obj)}")
        else:
            lines.append(value(name, obj, sources))
    return lines


def render() -> str:
    head = textwrap.dedent(f"""\
        # mprl's public API: names and signatures (tests/unit/test_public_api.py).
        # Generated: after a deliberate change, run
        #     {REGENERATE}
        # and review the diff. Removed or renamed names go to mprl/deprecated.py and CHANGELOG.md.
        """)
    sections = ["\n".join(describe(name, names)) for name, names in MODULES.items()]
    return head + "\n" + "\n\n".join(sections) + "\n"


def test_the_public_api_is_the_snapshot() -> None:
    current = render()
    if os.environ.get(UPDATE_ENV, "") not in ("", "0"):
        SNAPSHOT.write_text(current)
        return
    recorded = SNAPSHOT.read_text() if SNAPSHOT.exists() else ""
    if current != recorded:
        diff = "".join(
            difflib.unified_diff(
                recorded.splitlines(keepends=True),
                current.splitlines(keepends=True),
                str(SNAPSHOT.relative_to(REPO)),
                "the code now",
            )
        )
        pytest.fail(
            f"the public API changed:\n{diff}\nIf that is deliberate, regenerate the snapshot "
            f"with `{REGENERATE}` and commit it; a removed or renamed name also goes to "
            "mprl/deprecated.py (it keeps working, with a warning) and CHANGELOG.md.",
            pytrace=False,
        )


def test_the_snapshot_sees_what_a_user_sees() -> None:
    text = render()
    # signatures with types, defaults, keyword-only markers; no private name anywhere
    assert (
        "def run_serial(algorithm: str, *, plugins: PluginManager | Sequence[object] | None" in text
    )
    assert re.search(r"^class Algorithm\n    __init__\(name: str, config_cls: type, ", text, re.M)
    assert re.search(r"^class Array\(Field\)$", text, re.M)  # its private base stood in for
    assert re.search(
        r"^hook mprl_make_env\(env_id: str, .* -> gym.Env \| None  \['firstresult'\]$", text, re.M
    )
    assert re.search(
        r"^hook mprl_make_backend\(name: str\) -> Any  \['firstresult', 'warn", text, re.M
    )
    assert re.search(r"^fixture mprl_serial\(mprl_pm: PluginManager, tmp_path: Path\)", text, re.M)
    assert "NAME = 'mprl'" in text and "__version__: str" in text
    assert not re.search(r"\b_[a-z]\w*\(|0x[0-9a-f]{6}", text)
    sections = re.findall(r"^## (\S+)$", text, re.M)
    assert sections == list(MODULES) and "mprl.lib.nets" in sections


def test_the_reference_names_every_public_name() -> None:
    reference = (REPO / "docs" / "reference.md").read_text()
    api = reference.split("## 10. The public API", 1)[1].split("\n## ", 1)[0]
    for module_name, names in MODULES.items():
        module = importlib.import_module(module_name)
        assert f"`{module_name}`" in api, module_name
        missing = [n for n in names or defined_names(module) if f"`{n}" not in api]
        assert not missing, (module_name, missing)
