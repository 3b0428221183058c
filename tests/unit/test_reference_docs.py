"""docs/reference.md and docs/from-the-seed.md stay true: every Context member, Algorithm field
and testing helper is in the reference; the seed page's plugin code is the example's code."""

from __future__ import annotations

import ast
import inspect
import re

import attrs
import pytest

import mprl
from mprl import testing
from tests.conftest import REPO
from tests.unit.test_first_plugin_guide import code_blocks, contains_lines

REFERENCE = (REPO / "docs" / "reference.md").read_text()
SEED = (REPO / "docs" / "from-the-seed.md").read_text()


def test_every_public_context_member_is_in_the_reference():
    members = [n for n in dir(mprl.Context) if not n.startswith("_")]
    attributes = [f.alias or f.name for f in attrs.fields(mprl.Context) if f.init]
    missing = [n for n in {*members, *attributes} if f"ctx.{n}" not in REFERENCE]
    assert not [n for n in missing if n != "channel"], missing  # the backend's, not the plugin's


def test_every_algorithm_field_and_testing_helper_is_in_the_reference():
    for field in attrs.fields(mprl.Algorithm):
        assert f"`{field.name}" in REFERENCE, field.name
    helpers = [
        n for n, obj in vars(testing).items()
        if not n.startswith("_") and inspect.isfunction(obj) and obj.__module__ == testing.__name__
    ]  # fmt: skip
    assert helpers and all(f"`{name}" in REFERENCE for name in helpers), helpers
    assert "TRANSPORT_COSTS_TABLE" not in REFERENCE  # the measured table is filled in


@pytest.mark.parametrize("block", [b for b in code_blocks(SEED) if b.source])
def test_the_seed_page_copies_the_example_verbatim(block):
    assert contains_lines((REPO / block.source).read_text(), block.code), block.line


def test_the_hand_written_program_on_the_seed_page_is_python():
    (classic,) = [b for b in code_blocks(SEED) if b.lang == "python" and "__main__" in b.code]
    ast.parse(classic.code)
    # and what it keeps in Manager objects is what the plugin's schema declares
    for kind in ("Queue", "list", "Value", "Lock", "Event"):
        assert f"manager.{kind}(" in classic.code


def test_the_seed_plugin_is_under_100_lines():
    lines = (REPO / "examples" / "mprl-seed" / "mprl_seed.py").read_text().splitlines()
    assert len([line for line in lines if line.strip()]) < 100


PAGES = ("reference.md", "plugins.md", "running.md", "first-plugin.md", "backends.md")


@pytest.mark.parametrize("page", PAGES)
def test_every_file_of_the_repository_a_page_cites_exists(page):
    text = (REPO / "docs" / page).read_text()
    cited = set(re.findall(r"`((?:plugins|examples|tests|benchmarks)/[\w./-]+?)`", text))
    missing = sorted(p for p in cited if not (REPO / p).exists())
    assert not missing, f"docs/{page} cites files that do not exist: {missing}"


def test_the_reference_answers_what_plugin_authors_asked():
    # the off-policy example is a third-party example with its README and tests, not the test
    # suite's plugin nor a built-in's sources
    assert "`examples/mprl-td3` is a complete one" in REFERENCE
    assert "tests/plugins/mprl_dqn" not in REFERENCE and "plugins/mprl_builtin/dqn" not in REFERENCE
    # a Module stays on the CPU under --device; classes on a Queue are unpickled by the server
    assert "a `schema.Module` (a target network) too" in REFERENCE
    assert "Your own classes on a `Queue`" in REFERENCE
    # log_episode: numbers only, in the docstring and the Context table
    assert "numbers only" in REFERENCE and "Numbers only" in (mprl.Context.log_episode.__doc__)
    # a queue's maxsize is a size like the others
    assert "a `Queue`'s\n`maxsize` are a `Size`" in REFERENCE
    assert "`Size`" in (mprl.schema.Queue.__doc__ or "")
