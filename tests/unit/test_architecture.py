"""The shape of the package, read from the code: no import cycle among mprl's modules, leaves
that are leaves, no plugin or example reaching into a backend or into shared memory, no
function longer than 60 lines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "mprl"


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path, *, lazy: bool = True, typing: bool = False) -> set[str]:
    """The modules of ``mprl`` that ``path`` imports (``lazy``: also inside functions), type-only
    imports (under ``if TYPE_CHECKING:``) left out unless ``typing``."""
    found: set[str] = set()

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child) and not typing:
                continue
            inner = top and not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import) and (inner or lazy):
                found.update(a.name for a in child.names if a.name.split(".")[0] == "mprl")
            elif isinstance(child, ast.ImportFrom) and (inner or lazy) and child.module:
                if child.module.split(".")[0] != "mprl":
                    continue
                for alias in child.names:  # `from mprl import schema`: the submodule
                    sub = f"{child.module}.{alias.name}"
                    found.add(sub if sub in MODULES else child.module)
            visit(child, inner)

    visit(ast.parse(path.read_text()), True)
    return found


def graph(lazy: bool = True) -> dict[str, set[str]]:
    return {name: imports_of(path, lazy=lazy) & set(MODULES) for name, path in MODULES.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), plus self-imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or v in edges[v]:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return found


def test_the_graph_reader_finds_a_cycle_it_is_shown():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert "mprl.schema" in graph()["mprl.algorithm"]  # it reads real imports


def test_no_import_cycle_among_mprl_modules_even_counting_imports_inside_functions():
    assert cycles(graph(lazy=True)) == []


def test_the_parts_of_mprl_lib_import_each_other_one_way_even_for_types():
    """A plugin's parts build on each other in one direction (norms, torsos, optim <- configs <-
    nets <- recurrent <- envbatch <- offpolicy, marl): no two import each other, not even for a
    type hint, which is a cycle one refactor away (envbatch and recurrent were one)."""
    lib = {name: path for name, path in MODULES.items() if name.startswith("mprl.lib.")}
    edges = {name: imports_of(path, typing=True) & set(lib) for name, path in lib.items()}
    assert edges["mprl.lib.envbatch"] >= {"mprl.lib.recurrent"}  # it reads the real imports
    assert cycles(edges) == []


def test_the_author_api_and_the_run_wide_types_are_leaves_of_the_host_and_backends():
    edges = graph(lazy=False)
    author = ["mprl.algorithm", "mprl.context", "mprl.schema", "mprl.transport", "mprl.hookspecs"]
    for leaf in [*author, "mprl.run_types", "mprl.errors", "mprl.version"]:
        reach, todo = set(), [leaf]
        while todo:
            for nxt in edges[todo.pop()] - reach:
                reach.add(nxt)
                todo.append(nxt)
        assert not {
            m for m in reach if m.startswith(("mprl.host", "mprl.backends", "mprl.tools"))
        }, (
            leaf,
            reach,
        )
    # hookspecs imports pluggy only; the package's __init__ imports no host module at import time
    assert edges["mprl.hookspecs"] == set()
    assert not {m for m in edges["mprl"] if m.startswith(("mprl.host", "mprl.backends"))}


def test_the_host_knows_no_backend_but_the_seam():
    edges = graph(lazy=True)
    for name, targets in edges.items():
        if name.startswith("mprl.host"):
            backends = {t for t in targets if t.startswith("mprl.backends")}
            assert backends <= {"mprl.backends.base"}, (name, backends)


#: what a backend of its own may use of mprl's backends (docs/backends.md, "Writing a backend")
SEAM = {
    "mprl.backends.base",
    "mprl.backends.supervisor",
    "mprl.backends.child",
    "mprl.backends.processes",
    "mprl.backends.inprocess",
    "mprl.backends.restart",
}
#: the backends outside the core, on the seam alone: the built-in Ray backend and an example
RAY = REPO / "plugins" / "mprl_builtin" / "ray"
BACKEND_PLUGINS = {*RAY.glob("*.py"), REPO / "examples" / "mprl-threads" / "mprl_threads.py"}


#: folders of build output (``pip install`` of an example leaves a copy of its sources in
#: ``build/lib``, an old one after an edit): not sources
BUILT = {"build", "dist", ".venv", "__pycache__"}


def sources_in(folder: Path) -> list[Path]:
    """The Python sources under ``folder``, build output left out."""
    return [
        path
        for path in folder.rglob("*.py")
        if not any(part in BUILT or part.endswith(".egg-info") for part in path.parts)
    ]


def test_plugins_and_examples_use_no_backend_and_no_shared_memory():
    sources = [*sources_in(REPO / "plugins"), *sources_in(REPO / "examples")]
    assert len(sources) > 5 and set(sources) >= BACKEND_PLUGINS and len(BACKEND_PLUGINS) > 7
    for path in sources:
        text = path.read_text()
        assert "share_memory" not in text and "/dev/shm" not in text, path
        backends = {m for m in imports_of(path) if m.startswith("mprl.backends")}
        allowed = SEAM if path in BACKEND_PLUGINS else set()
        assert backends <= allowed, (path, backends - allowed)


def test_the_seam_names_no_concrete_backend():
    """The seam (and what a backend of its own may use) imports no module of the local, serial
    or Ray backend, lazily neither: a backend is found through the plugin manager."""
    edges = graph(lazy=True)
    for name in SEAM:
        concrete = {t for t in edges[name] if t.startswith(("mprl.backends.local",
                    "mprl.backends.serial"))}  # fmt: skip
        assert not concrete, (name, concrete)


def test_no_backend_touches_a_private_name_of_the_context():
    """The child runtime hands a Context what it needs; backends use its public API (and
    ``mprl.context.objects_of``), never ``ctx._model``, ``ctx._slot`` ..."""
    import re

    private = re.compile(r"\b(ctx|context|self\.ctx|c\.ctx|p\.ctx)\._[a-z]\w*")
    found = [
        f"{path.relative_to(REPO)}: {m.group(0)}"
        for path in [*(PACKAGE / "backends").rglob("*.py"), *BACKEND_PLUGINS]
        for m in private.finditer(path.read_text())
    ]
    assert found == []


def test_the_gpu_learner_is_no_part_of_the_author_api():
    edges = graph(lazy=True)
    assert "mprl.backends.child" not in edges["mprl.context"]
    assert not (PACKAGE / "learner.py").exists()


#: the longest a function of mprl may be, from its ``def`` to its last line, docstring included
LONGEST_FUNCTION = 60


def test_no_function_of_the_core_is_longer_than_a_screen():
    """A function past 60 lines is split into named steps (the CLI's parser builder was 111)."""
    long = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if lines > LONGEST_FUNCTION:
                    long.append(f"{name}.{node.name}: {lines} lines")
    assert not long, long


def test_the_host_and_the_tools_import_nothing_of_mprl_lib():
    """``mprl.lib`` is for plugins: the host and the tools reach environments through the env
    hooks and the env room, never through it (lazy imports count)."""
    edges = graph(lazy=True)
    found = {
        name: sorted(t for t in targets if t == "mprl.lib" or t.startswith("mprl.lib."))
        for name, targets in edges.items()
        if name.startswith(("mprl.host", "mprl.tools"))
    }
    assert {name: lib for name, lib in found.items() if lib} == {}
    assert "mprl.environments.agents" in edges["mprl.lib.marl"]  # lib builds on the env room


def test_the_env_room_is_a_plugin_of_the_core_reached_through_the_env_hooks():
    """``mprl.environments`` is registered by name (DEFAULT_PLUGINS), imports no host, tool,
    backend or lib module, and the host imports none of it: what the host needs of it goes
    through the hooks (``mprl_make_env``, ``mprl_adapt_env``, ``mprl_check_env``,
    ``mprl_env_workload``)."""
    from mprl.host.envs import ENV_PLUGIN
    from mprl.host.plugins import DEFAULT_PLUGINS

    assert ENV_PLUGIN == "mprl.environments" and ENV_PLUGIN in DEFAULT_PLUGINS
    edges = graph(lazy=True)
    room = {name for name in edges if name.split(".")[:2] == ["mprl", "environments"]}
    assert len(room) >= 4
    for name in room:
        outside = {t for t in edges[name] if t.startswith(("mprl.host", "mprl.tools",
                                                            "mprl.backends", "mprl.lib"))}  # fmt: skip
        assert not outside, (name, outside)
    for name, targets in edges.items():
        if name.startswith("mprl.host"):
            assert not targets & room, (name, targets & room)


def private_uses(source: str) -> list[str]:
    """The private names of mprl that ``source`` uses: ``from mprl.x import _y``, and ``._y``
    of a name it bound to an mprl module or an mprl name."""
    tree = ast.parse(source)
    found, bound = [], {"mprl"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mprl":
            found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
            bound |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            mine = [a for a in node.names if a.name.split(".")[0] == "mprl"]
            bound |= {(a.asname or a.name).split(".")[0] for a in mine}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and re.match(r"_[^_]", node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in bound:
                found.append(ast.unparse(node))
    return found


def test_plugins_and_examples_use_no_private_name_of_mprl():
    """A built-in plugin (the sweep included) uses what a third-party one can: no ``_name`` of
    mprl, imported or reached as an attribute."""
    bad = "import torch\nfrom mprl.tools import report\nfrom mprl.tools.report import _x\n"
    bad += "report._y(torch._z)\n"
    assert private_uses(bad) == ["mprl.tools.report._x", "report._y"]
    sources = [*sources_in(REPO / "plugins"), *sources_in(REPO / "examples")]
    assert REPO / "plugins" / "mprl_builtin" / "sweep" / "runner.py" in sources
    found = {str(p.relative_to(REPO)): private_uses(p.read_text()) for p in sources}
    assert {path: names for path, names in found.items() if names} == {}


def _module_state(path: Path) -> list[str]:
    """What a module keeps between calls at module level: a name bound to a mutable container
    (but for ``__all__`` and public ALL_CAPS constants; ``_SEEN`` is state), a ``global``
    statement, a cached function."""
    found = []
    tree = ast.parse(path.read_text())
    mutable = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
    makers = {"dict", "list", "set", "defaultdict", "deque", "OrderedDict", "WeakValueDictionary"}
    makers |= {n.name for n in tree.body if isinstance(n, ast.ClassDef)}  # an object of its own
    for node in tree.body:
        targets = []
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        for target in targets:
            name = getattr(target, "id", "__all__")
            if name == "__all__" or (name.isupper() and not name.startswith("_")):
                continue
            call = isinstance(value, ast.Call) and getattr(value.func, "id", "") in makers
            if isinstance(value, mutable) or call:
                found.append(f"{path.name}: {name} = ...")
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found.append(f"{path.name}: global {', '.join(node.names)}")
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for deco in node.decorator_list:
                name = ast.unparse(deco)
                if name.split("(")[0].endswith(("cache", "lru_cache", "cached_property")):
                    found.append(f"{path.name}: @{name} {node.name}")
    return found


def test_the_state_reader_finds_module_state(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import functools\n_SEEN: dict = {}\nhints = dict()\nLIMITS = {'a': 1}\n"
        "def f():\n    global x\n@functools.cache\ndef g():\n    pass\n"
    )
    assert sorted(_module_state(bad)) == [
        "bad.py: @functools.cache g",
        "bad.py: _SEEN = ...",
        "bad.py: global x",
        "bad.py: hints = ...",
    ]


def test_backends_and_transport_keep_no_module_level_state():
    """Per-process state lives on instances (an endpoint, a supervisor, an early start's
    handle), never in module globals no signature shows."""
    found = [
        finding
        for room in (PACKAGE / "backends", PACKAGE / "transport", RAY)
        for path in sorted(room.rglob("*.py"))
        for finding in _module_state(path)
    ]
    assert found == []


def _mapped_modules() -> set[str]:
    """The modules docs/architecture.md's map names: each ``x.py`` under the folder it is
    listed in, by indentation."""
    text = (REPO / "docs" / "architecture.md").read_text()
    block = text.split("## The map", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    named: set[str] = set()
    folders: list[tuple[int, str]] = []
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        names = line[indent:].split("   ")[0].split()  # the names before the prose
        while folders and folders[-1][0] >= indent:
            folders.pop()
        if len(names) == 1 and names[0].endswith("/"):
            folders.append((indent, names[0]))
            continue
        where = "".join(f for _, f in folders)
        named.update(where + name for name in names if name.endswith(".py"))
    return named


def test_the_map_names_every_module_and_no_other():
    """docs/architecture.md's map stays true: every module of mprl/ is in it, under its folder
    (a package's __init__.py where it holds more than a docstring), and nothing else is."""
    actual = set()
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(REPO).as_posix()
        if path.name == "__init__.py" and not any(
            isinstance(n, ast.FunctionDef | ast.ClassDef) for n in ast.parse(path.read_text()).body
        ):
            continue
        actual.add(relative)
    mapped = {m for m in _mapped_modules() if m.startswith("mprl/")}
    assert len(mapped) > 60 and "mprl/backends/local/forkserver_init.py" in mapped
    assert sorted(actual - mapped) == [], "modules missing from docs/architecture.md's map"
    assert sorted(mapped - actual) == [], "names in the map that are no module"
