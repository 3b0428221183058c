"""The README and the topic pages of docs/ stay usable: the README stays a short guide that links
every page, their links resolve, and the commands they show name subcommands and run flags that
exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mprl.tools.cli import main
from tests.conftest import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
#: the pages the README's long explanations moved to
TOPIC_PAGES = [
    "running.md",
    "faults.md",
    "backends.md",
    "algorithms.md",
    "atari-mujoco.md",
    "architecture.md",
    "plugins.md",
    "sweeps.md",
    "export.md",
]
PAGES = [README, *(DOCS / name for name in TOPIC_PAGES)]


def links(text: str) -> list[str]:
    """The local targets of the markdown links in ``text``, without anchors."""
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    return [t for t in targets if "://" not in t]


def test_the_readme_is_a_guide_that_links_every_docs_page() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 300, "README.md grows past a guide: move the detail to docs/"
    linked = {Path(t).name for t in links(text) if t.startswith("docs/")}
    pages = {p.name for p in DOCS.glob("*.md")}
    assert pages <= linked, f"README.md does not link {sorted(pages - linked)}"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_links_resolve(page: Path) -> None:
    broken = [t for t in links(page.read_text()) if not (page.parent / t).exists()]
    assert not broken, f"{page.relative_to(REPO)} links to missing files: {broken}"


def commands(text: str) -> list[tuple[str, str]]:
    """``(subcommand, its arguments)`` of every ``python -m mprl SUBCOMMAND ...`` in ``text``,
    a command continued with ``\\`` included, shell comments left out."""
    text = re.sub(r"\\\n\s*", " ", text)
    found = re.findall(r"python -m mprl ([a-z]+)\b([^`\n]*)", text)
    return [(sub, args.split(" #")[0]) for sub, args in found]


def help_text(subcommand: str, capsys: pytest.CaptureFixture[str]) -> str:
    """What ``python -m mprl SUBCOMMAND --help`` prints."""
    try:
        code = main([subcommand, "--help"])
    except SystemExit as exc:  # argparse's own --help
        code = exc.code
    assert code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_subcommands_and_their_flags_exist(page: Path, capsys: pytest.CaptureFixture[str]) -> None:
    used = commands(page.read_text())
    subcommands = {sub for sub, _ in used}
    assert subcommands <= {"run", "sweep", "export", "plugins", "eval", "plot", "runs"}, subcommands
    unknown = []
    for sub in sorted(subcommands):
        usage = help_text(sub, capsys)
        flags = {
            f for s, args in used if s == sub for f in re.findall(r"(?<!\S)--?[a-z][\w-]*", args)
        }
        unknown += [f"{sub} {f}" for f in sorted(flags)
                    if not re.search(rf"(?<![\w-]){f}(?![\w-])", usage)]  # fmt: skip
    assert not unknown, f"{page.relative_to(REPO)} uses flags the CLI does not know: {unknown}"


def test_no_page_names_a_module_that_moved() -> None:
    stale = r"mprl_make_backend|FAULTS\.md|\bmprl\.(serial|nets|plugins)\b"
    # the built-ins' old modules (now mprl_builtin.NAME) as paths, imports or attributes; a
    # third party's mprl_dqn may be named
    old = r"mprl_(a3c|dqn|impala|mappo|ppo|sac|tensorboard)"
    stale += rf"|(plugins/|\bimport |\bfrom ){old}\b|\b{old}\.\w"
    found = [p.name for p in PAGES if re.search(stale, p.read_text())]
    assert not found, f"stale names in {found}"


def test_the_fault_table_names_tests_that_exist() -> None:
    named = set(re.findall(r"`(test_\w+?)(?:\.py)?`", (DOCS / "faults.md").read_text()))
    assert len(named) > 20
    sources = "\n".join(p.read_text() for p in (REPO / "tests").rglob("test_*.py"))
    files = {p.stem for p in (REPO / "tests").rglob("test_*.py")}
    missing = [n for n in sorted(named) if n not in files and f"def {n}(" not in sources]
    assert not missing, f"docs/faults.md names tests that do not exist: {missing}"


def test_the_reserved_names_are_every_name_mprl_and_its_built_ins_claim():
    """plugins.md's reserved names list every entry point of mprl's own ``mprl`` group, the
    core's commands and the run options of its built-in plugins (the core's are the
    ``RunConfig`` fields, which the page names as such)."""
    from mprl.host.plugins import DEFAULT_PLUGINS, get_plugin_manager
    from mprl.tools.cli import CORE_COMMANDS

    section = (DOCS / "plugins.md").read_text().split("## Reserved names")[1]
    group = (REPO / "pyproject.toml").read_text().split("[project.entry-points.mprl]")[1]
    plugins = re.findall(r"^([\w-]+) = ", group.split("\n[")[0], re.M)
    assert {"a3c", "dqn", "tensorboard"} <= set(plugins)
    owners = get_plugin_manager().run_options().owners
    options = [o for o, by in owners.items() if by in {*plugins, *DEFAULT_PLUGINS}]
    assert "tensorboard" in options and "ray_address" in options
    assert "the `RunConfig` fields" in section
    names = [*plugins, *CORE_COMMANDS, *options, "mprl_builtin"]
    missing = [name for name in names if f"`{name}`" not in section]
    assert not missing, f"docs/plugins.md's reserved names leave out {missing}"
