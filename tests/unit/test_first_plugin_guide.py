"""docs/first-plugin.md stays true: its code is the example's code, its commands' flags exist, and
the mprl.testing fixtures and functions it names are there.

A code block the guide copies from a file is marked by the line right before it:
``<!-- from: examples/mprl-reinforce/mprl_reinforce.py -->`` (a path from the repository root).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
from types import ModuleType

import attrs
import pytest

from mprl import hookspecs, testing
from mprl.host.config import fields_of
from mprl.tools.cli import main
from tests.conftest import REPO

GUIDE = REPO / "docs" / "first-plugin.md"
EXAMPLE = REPO / "examples" / "mprl-reinforce"
TEXT = GUIDE.read_text()
HOOKS = {name for name in dir(hookspecs) if name.startswith("mprl_")}


@attrs.frozen
class Block:
    source: str  # the file named by the marker, "" when unmarked
    lang: str
    line: int  # where the block starts in the guide
    code: str


def code_blocks(text: str) -> list[Block]:
    """The fenced code blocks of ``text`` at any indentation, with the file each one names."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        fence = re.fullmatch(r"(\s*)```(\w*)", lines[i])
        if not fence:
            i += 1
            continue
        indent, start = fence.group(1), i
        end = next(j for j in range(i + 1, len(lines)) if lines[j] == f"{indent}```")
        body = [line.removeprefix(indent) for line in lines[start + 1 : end]]
        marker = re.fullmatch(r"\s*<!-- from: (\S+) -->", lines[start - 1]) if start else None
        source = marker.group(1) if marker else ""
        blocks.append(Block(source, fence.group(2), start + 1, "\n".join(body)))
        i = end + 1
    return blocks


BLOCKS = code_blocks(TEXT)
COPIED = [b for b in BLOCKS if b.source]


def contains_lines(haystack: str, needle: str) -> bool:
    """Whether ``needle``'s lines are whole, contiguous lines of ``haystack``."""
    big, small = haystack.splitlines(), needle.splitlines()
    return any(big[i : i + len(small)] == small for i in range(len(big) - len(small) + 1))


def test_the_guide_copies_from_every_file_of_the_example() -> None:
    sources = {b.source for b in COPIED}
    example = "examples/mprl-reinforce/"
    assert {f"{example}{name}" for name in ("mprl_reinforce.py", "pyproject.toml")} <= sources
    assert {f"{example}conftest.py", f"{example}tests/test_reinforce.py"} <= sources
    assert all(b.lang for b in BLOCKS), "every code block says its language"


@pytest.mark.parametrize("block", COPIED, ids=[f"line{b.line}" for b in COPIED])
def test_a_copied_block_is_verbatim_in_its_file(block: Block) -> None:
    path = REPO / block.source
    assert path.is_file(), f"docs/first-plugin.md:{block.line} copies from missing {path}"
    assert contains_lines(path.read_text(), block.code), (
        f"docs/first-plugin.md:{block.line}: the block differs from {block.source}; copy the "
        "current code (whole definitions or contiguous lines) into the guide"
    )


def test_the_guide_walks_through_every_definition_of_the_plugin() -> None:
    source = EXAMPLE / "mprl_reinforce.py"
    shown = "\n".join(b.code for b in COPIED if REPO / b.source == source)
    lines = source.read_text().splitlines()
    missing = []
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.Assign):
            first = node.decorator_list[0].lineno if getattr(node, "decorator_list", []) else None
            text = "\n".join(lines[(first or node.lineno) - 1 : node.end_lineno])
            if text != '__version__ = "0.1.0"' and not contains_lines(shown, text):
                missing.append(text.splitlines()[-1 if first else 0])
    assert not missing, f"the guide does not show: {missing}"


# -- commands -------------------------------------------------------------------------------


def run_commands(text: str) -> list[str]:
    """The arguments of every ``python -m mprl run`` in the guide (in code blocks or inline),
    without shell comments."""
    found = re.findall(r"python -m mprl run\b([^`\n]*)", text)
    return [args.split(" #")[0] for args in found]


def test_every_run_flag_the_guide_uses_exists(capsys: pytest.CaptureFixture[str]) -> None:
    flags = {f for args in run_commands(TEXT) for f in re.findall(r"(?<!\S)--[a-z][\w-]*", args)}
    flags |= set(re.findall(r"`(--[a-z][\w-]*)", TEXT))  # flags named alone: `--serial`
    assert {"--plugin", "--serial", "--set", "--total-steps", "--workers"} <= flags
    assert main(["run", "--help"]) == 0
    usage = capsys.readouterr().out
    unknown = [f for f in sorted(flags) if not re.search(rf"(?<![\w-]){f}(?![\w-])", usage)]
    assert not unknown, f"docs/first-plugin.md uses flags `run --help` does not know: {unknown}"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "guide_mprl_reinforce", EXAMPLE / "mprl_reinforce.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_config_field_the_guide_sets_exists() -> None:
    fields = fields_of(load_example().Config)
    keys = set(re.findall(r"--set ([a-z_]\w*)=", TEXT)) | set(re.findall(r"`(\w+) = [^`]+`", TEXT))
    assert {"lr", "hidden"} <= keys
    assert keys <= set(fields), f"not fields of mprl_reinforce.Config: {keys - set(fields)}"


# -- mprl.testing ---------------------------------------------------------------------------


def table_names(text: str, header: str) -> dict[str, str]:
    """First-column code spans of the table whose header row starts with ``| header |``:
    ``{name: the span}``."""
    rows = re.search(rf"^\| {header} \|.*\n\|[-|]+\|\n((?:\|.*\n)+)", text, flags=re.MULTILINE)
    assert rows, f"docs/first-plugin.md has no '| {header} |' table"
    spans = re.findall(r"^\| `([^`]+)` \|", rows.group(1), flags=re.MULTILINE)
    return {re.match(r"\w+", span).group(): span for span in spans}  # type: ignore[union-attr]


def test_the_fixtures_the_guide_names_exist(request: pytest.FixtureRequest) -> None:
    named = set(table_names(TEXT, "Fixture"))
    # any other mprl_* word is a hook, a module, or a fixture too
    modules = {p.stem for p in (REPO / "plugins").iterdir()} | {"mprl_reinforce"}
    named |= set(re.findall(r"\bmprl_\w+", TEXT)) - HOOKS - modules
    assert named == {"mprl_pm", "mprl_recorder", "mprl_serial", "mprl_state", "mprl_bench"}
    for name in sorted(named):
        assert callable(getattr(testing, name)), f"mprl.testing has no fixture {name}"
        request.getfixturevalue(name)  # what `pytest_plugins = ["mprl.testing"]` offers


def test_the_functions_the_guide_names_exist() -> None:
    functions = table_names(TEXT, "Function")
    assert set(functions) == {
        "plugin_manager",
        "registered",
        "call_hook",
        "build_state",
        "run_serial",
        "Bench",
    }
    for name, span in functions.items():
        params = inspect.signature(getattr(testing, name)).parameters
        shown = re.findall(r"(\w+)(?:=[^,)]*)?(?=[,)])", span.partition("(")[2])
        assert set(shown) <= set(params), f"`{span}`: {name} takes {list(params)}"
    imported = re.findall(r"^from mprl\.testing import (.+)$", TEXT, flags=re.MULTILINE)
    names = {n.strip() for line in imported for n in line.split(",")}
    assert names and all(hasattr(testing, n) for n in names), names


def test_the_serial_result_members_the_guide_names_exist() -> None:
    members = set(re.findall(r"`result\.(\w+)`", TEXT))
    assert {"summary", "model", "state", "records", "episode_returns"} <= members
    assert all(hasattr(testing.SerialResult, m) or m in attrs.fields_dict(testing.SerialResult)
               for m in members), members  # fmt: skip


# -- links ----------------------------------------------------------------------------------


def test_the_guide_links_to_the_references_and_its_links_resolve() -> None:
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", TEXT)
    assert {"hooks.md", "schema.md"} <= set(targets)
    local = [t for t in targets if "://" not in t]
    broken = [t for t in local if not (GUIDE.parent / t).exists()]
    assert not broken, f"docs/first-plugin.md links to missing files: {broken}"
