"""Commands that plugins add to ``python -m mprl`` (``mprl_register_commands``): read through the
real command line, with plugins installed as distributions on ``sys.path``, in this process."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from mprl.host.plugins import get_plugin_manager
from mprl.tools.cli import main
from tests.conftest import cli_here, write_distribution

HELLO = textwrap.dedent("""\
    import mprl
    from mprl.errors import UsageError


    def add_arguments(parser, plugins):
        parser.add_argument("who")
        parser.add_argument("--times", type=int, default=1)


    def hello(args, plugins):
        if args.who == "nobody":
            raise UsageError("hello: give somebody's name")
        print(f"hello {args.who} " * args.times + f"({len(plugins.algorithms())} algorithms)")
        return 3


    @mprl.hookimpl
    def mprl_register_commands(register):
        register("hello", "say hello", add_arguments, hello)
""")


def command_plugin(name: str, help: str, add: str = "pass") -> str:
    """A plugin whose command ``name`` prints its name; ``add`` is its add_arguments' body."""
    return textwrap.dedent(f"""\
        import mprl


        def add_arguments(parser, plugins):
            {add}


        def run(args, plugins):
            print("ran {name} of " + __name__)


        @mprl.hookimpl
        def mprl_register_commands(register):
            register({name!r}, {help!r}, add_arguments, run)
    """)


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``site(dist, {entry point: source})``: install a distribution for this test."""

    def install(dist: str, plugins: dict[str, str]) -> None:
        root = tmp_path / dist
        root.mkdir()
        modules = {f"cmdtest_{name.replace('-', '_')}": src for name, src in plugins.items()}
        entry_points = {name: f"cmdtest_{name.replace('-', '_')}" for name in plugins}
        write_distribution(root, dist, entry_points, modules)
        monkeypatch.syspath_prepend(str(root))

    yield install


def test_a_plugins_command_runs_with_its_arguments_and_returns_its_exit_code(site, capsys):
    site("mprl-hello", {"hello": HELLO})
    assert main(["hello", "you", "--times", "2"]) == 3
    out = capsys.readouterr().out
    assert out.startswith("hello you hello you (") and "algorithms)" in out
    code, err = cli_here(capsys, "hello", "nobody")  # a UsageError: one line, exit 2
    assert (code, err) == (2, "mprl: error: hello: give somebody's name\n")
    code, err = cli_here(capsys, "hello", "-p", "no:hello")  # blocked: no such command
    assert code == 2 and "invalid choice: 'hello'" in err


def test_help_and_plugins_list_the_commands_and_who_provides_them(site, capsys):
    site("mprl-hello", {"hello": HELLO})
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "say hello [hello]" in out and "run several seeds, a grid or an Optuna search" in out
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    block = out.split("\nhello  (mprl-hello 0.1.0)\n", 1)[1].split("\n    hooks:")[0]
    assert "    commands:   hello" in block
    assert "sweep      run several seeds" in out and "hello      say hello  [hello]" in out
    assert main(["plugins", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["commands"]["hello"] == {"plugin": "hello", "help": "say hello"}
    assert data["commands"]["sweep"]["plugin"] == "sweep"
    assert next(p for p in data["plugins"] if p["name"] == "hello")["commands"] == ["hello"]


def test_a_command_two_plugins_register_is_an_error_naming_both(site, capsys):
    site("mprl-twice", {"one": command_plugin("greet", "first"),
                        "two": command_plugin("greet", "second")})  # fmt: skip
    code, err = cli_here(capsys, "greet")
    assert code == 2 and err.count("\n") == 1
    assert "command 'greet' is registered by two plugins: 'one' and 'two'" in err
    assert "block one with -p no:NAME" in err
    assert main(["greet", "-p", "no:one"]) == 0  # the other one, once one is blocked
    assert "ran greet of cmdtest_two" in capsys.readouterr().out
    main(["plugins"])
    assert "CONFLICT command 'greet' is registered by one and two" in capsys.readouterr().out


def test_a_plugin_cannot_take_a_core_command(site, capsys, tmp_path):
    site("mprl-taker", {"taker": command_plugin("runs", "not the core's")})
    assert main(["runs", str(tmp_path)]) == 0  # the core's runs, not the plugin's
    out = capsys.readouterr().out
    assert "ran runs" not in out
    main(["plugins"])
    assert "CONFLICT command 'runs' is registered by mprl and taker" in capsys.readouterr().out
    pm = get_plugin_manager()
    assert "runs" not in pm.commands(reserved=["runs"]) and "runs" in pm.commands()


def test_a_broken_plugin_leaves_the_other_commands_working(site, capsys):
    site("mprl-broken-cmd", {"broken-cmd": "raise ImportError('needs the frobnicator')\n"})
    site("mprl-badargs", {"badargs": command_plugin("bad", "bad", "import frobnicator")})
    site("mprl-hello", {"hello": HELLO})
    assert main(["hello", "you"]) == 3  # unaffected by either
    capsys.readouterr()
    code, err = cli_here(capsys, "bad", "--whatever")  # its arguments failed: said when given
    assert code == 2 and err.count("\n") == 1
    assert "plugin 'badargs': command 'bad' failed: ModuleNotFoundError" in err
    assert "block it with -p no:badargs" in err
    code, err = cli_here(capsys, "frob")  # maybe the broken plugin's: it is named
    assert code == 2 and "invalid choice: 'frob'" in err
    assert "plugin 'broken-cmd' (entry point broken-cmd = cmdtest_broken_cmd" in err
    assert "failed to import: ImportError: needs the frobnicator" in err


@pytest.mark.parametrize(
    "call",
    ['register("Hello World", "h", add_arguments, run)', 'register("x", "h", add_arguments)',
     'register("x", "h", add_arguments, "not callable")', 'register("x", "h", add_arguments, run, 1)'],
)  # fmt: skip
def test_a_bad_registration_names_the_plugin_and_what_register_takes(site, tmp_path, call):
    source = command_plugin("x", "h").replace("register('x', 'h', add_arguments, run)", call)
    assert call in source
    site("mprl-bad-register", {"badreg": source})
    pm = get_plugin_manager()
    assert "x" not in pm.commands()
    [failed] = [f for f in pm.failed if f.name == "badreg"]
    assert failed.stage == "register what it provides"
    assert "mprl_register_commands called register(" in failed.error
    assert "expected a command name (lower case), a help line, add_arguments" in failed.error
    assert main(["runs", str(tmp_path)]) == 0  # the rest of the CLI works
