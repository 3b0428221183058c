"""A third-party plugin of the last release (mprl 0.1.0) installs and passes its own tests
unchanged: ``tests/compat/mprl-reinforce-0.1.0`` is ``examples/mprl-reinforce`` as released
(``git archive 862c842^ examples/mprl-reinforce``), byte for byte. Its suite imports
``mprl.plugins``, which moved; that import works, with the one deprecation warning expected."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, cli

FROZEN = REPO / "tests" / "compat" / "mprl-reinforce-0.1.0"
#: every file of the released plugin and its sha256: a changed or an added file is no longer
#: the release
RELEASED = {
    "README.md": "3947de01a21b7be4b2836ede36d7b40a9510a72f5b7b7ab0fcd9b8966533050a",
    "conftest.py": "2eaa0fb689983f6770040e645fa7e8afb48a52199efd06a36f3b9313d0ce11a2",
    "mprl_reinforce.py": "5b350cfada7af036e418db397599862fb49b2705eaaec060083cc0c89f30ff16",
    "pyproject.toml": "e5e3358454d56f6f2d40201bd9591d66b693f0565af5451e6926496eec735ac2",
    "tests/test_reinforce.py": "227470a61943e0c028cb943eb04999d87a2ffe26a1617af96031cbe0f3947c69",
}
RELEASED_TESTS = 14  # its suite's tests, parametrized cases counted
IGNORED = {"__pycache__", ".pytest_cache", "build"}  # what running or building it leaves

# A pytest plugin for the plugin's own run, kept out of its directory: every warning pytest
# records (at collection too), one JSON line each.
RECORDER = """\
import json
import os


def pytest_warning_recorded(warning_message, when, nodeid, location):
    category = warning_message.category
    with open(os.environ["MPRL_COMPAT_WARNINGS"], "a") as f:
        record = {
            "category": f"{category.__module__}.{category.__qualname__}",
            "deprecation": issubclass(category, DeprecationWarning),
            "message": str(warning_message.message),
            "filename": warning_message.filename,
            "lineno": warning_message.lineno,
        }
        f.write(json.dumps(record) + "\\n")
"""


def test_the_frozen_copy_is_the_release_byte_for_byte() -> None:
    files = {
        p.relative_to(FROZEN).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in FROZEN.rglob("*")
        if p.is_file()
        and not IGNORED & set(p.relative_to(FROZEN).parts)
        and not any(part.endswith(".egg-info") for part in p.parts)
    }
    assert files == RELEASED
    # and it is the 0.1.0 spelling this test is about
    suite = (FROZEN / "tests" / "test_reinforce.py").read_text()
    assert "from mprl.plugins import PluginManager" in suite


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The released plugin, copied out (building it writes into its directory) and installed
    the way pip installs it into a site directory of its own: ``(its directory, the site)``."""
    root = tmp_path_factory.mktemp("compat")
    source, site = root / "mprl-reinforce-0.1.0", root / "site"
    shutil.copytree(FROZEN, source, ignore=shutil.ignore_patterns(*IGNORED, "*.egg-info"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(site), str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (root / "recorder").mkdir()
    (root / "recorder" / "mprl_compat_recorder.py").write_text(RECORDER)
    return source, site


def test_the_released_plugin_installs_as_a_distribution_mprl_finds(released) -> None:
    _, site = released
    listing = cli("plugins", env={"PYTHONPATH": os.pathsep.join([str(site), *_pythonpath()])})
    assert listing.returncode == 0, listing.stderr
    assert "reinforce  (mprl-reinforce 0.1.0)" in listing.stdout
    assert "    algorithms: reinforce\n" in listing.stdout and "FAILED" not in listing.stdout


def test_the_released_plugin_passes_its_own_tests_with_the_expected_warnings(released) -> None:
    source, site = released
    warnings_file = source.parent / "warnings.jsonl"
    # as its author runs them: `python -m pytest` in its directory, the plugin installed; no
    # option of this suite (PYTEST_ADDOPTS) reaches that run
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    recorder = source.parent / "recorder"
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(recorder), *_pythonpath()])
    env["MPRL_COMPAT_WARNINGS"] = str(warnings_file)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "mprl_compat_recorder"],
        cwd=source, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"rootdir: {source}\nconfigfile: pyproject.toml\n" in out, out  # its settings, not ours
    summary = re.search(r"^=+ (\d+) passed(?:, (\d+) warnings?)? in", out, flags=re.MULTILINE)
    assert summary and int(summary[1]) == RELEASED_TESTS, out
    # the deprecations mprl or the plugin raised (a library's own are not about this upgrade)
    recorded = [json.loads(line) for line in warnings_file.read_text().splitlines()]
    ours = [
        w for w in recorded
        if w["deprecation"]
        and (w["category"].startswith("mprl.") or w["filename"].startswith((str(source), str(REPO))))
    ]  # fmt: skip
    assert [(Path(w["filename"]).relative_to(source).as_posix(), w["lineno"]) for w in ours] == [
        ("tests/test_reinforce.py", 15)  # from mprl.plugins import PluginManager
    ], ours
    (moved,) = ours
    assert moved["category"] == "mprl.deprecated.MprlDeprecationWarning"
    assert moved["message"].startswith(
        "mprl.plugins.PluginManager is deprecated: use mprl.host.plugins.PluginManager instead"
    )
    assert "0.3.0" in moved["message"]


def _pythonpath() -> list[str]:
    return [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
