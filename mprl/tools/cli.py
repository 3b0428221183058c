"""``python -m mprl``: run, plugins, plot, eval, runs, and the commands plugins register
(``mprl_register_commands``: the built-in ``sweep`` is one).

Exit codes: 0 finished, 1 the run failed (a process crashed, the disk filled up), 2 bad usage or
config (nothing was started), 130 / 143 / 129 stopped by SIGINT / SIGTERM / SIGHUP after a clean
shutdown.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence
from functools import partial
from typing import Any

import attrs

from mprl import startup
from mprl.deprecated import MprlDeprecationWarning
from mprl.errors import RunFailed, UsageError
from mprl.host.config import describe_fields, load_toml, parse_assignments, parse_value
from mprl.host.options import RunOptions
from mprl.host.plugins import BLOCK_ENV, CommandInfo, PluginManager, get_plugin_manager
from mprl.host.progress import SafeStream, say
from mprl.run_types import Summary
from mprl.timeline import mark
from mprl.version import __version__

EXIT_FAILED, EXIT_USAGE = 1, 2
#: the core's own commands; a plugin's command of the same name is left out
CORE_COMMANDS = ("run", "eval", "runs", "plot", "plugins")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 too; keep its message short
        self.print_usage(sys.stderr)
        raise UsageError(message)


def _blocked(values: Sequence[str]) -> list[str]:
    out = []
    for value in values:
        if not value.startswith("no:"):
            raise UsageError(f"-p {value!r}: only -p no:NAME (block plugin NAME) is supported")
        out.append(value[3:])
    return out


def _parser(pm: PluginManager | None = None) -> argparse.ArgumentParser:
    """The command line; ``run``'s options are those ``pm`` knows (the core's without it)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-p", dest="plugin_options", action="append", default=[], metavar="no:NAME",
        help="block plugin NAME (repeatable), or with no:DIST:NAME only distribution DIST's "
        "plugin NAME; MPRL_BLOCK_PLUGINS=a,b does the same",
    )  # fmt: skip
    parser = _Parser(prog="python -m mprl", description="Multi-process reinforcement learning.")
    parser.add_argument("--version", action="version", version=f"mprl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_run(sub, common, pm.run_options() if pm is not None else RunOptions([]))
    plugins = sub.add_parser("plugins", parents=[common], help="list installed plugins")
    plugins.add_argument("--json", action="store_true", help="machine-readable output")
    _add_plot(sub)
    _add_eval(sub, common)
    runs = sub.add_parser("runs", help="list run directories and how they ended")
    runs.add_argument(
        "directory", nargs="?", default="runs", metavar="DIR",
        help="where to look, up to 3 levels down [default runs]",
    )  # fmt: skip
    if pm is not None:
        for info in pm.commands(reserved=CORE_COMMANDS).values():
            _add_command(sub, common, info, pm)
        for name, owners in pm.command_conflicts.items():
            if name not in CORE_COMMANDS:  # the core's own wins; `plugins` shows the conflict
                both = " and ".join(repr(o) for o in owners)
                fix = f"block one with -p no:NAME or {BLOCK_ENV}=NAME"
                _stub(sub, name, f"command {name!r} is registered by two plugins: {both}; {fix}")
    return parser


def _add_command(
    sub: Any, common: argparse.ArgumentParser, info: CommandInfo, pm: PluginManager
) -> None:
    """A plugin's command: its parser, its arguments added by the plugin. One whose arguments
    fail to be added is still listed, and says so when it is given."""
    parser = sub.add_parser(info.name, parents=[common], help=f"{info.help} [{info.plugin}]")
    parser.set_defaults(plugin_command=info)
    try:
        info.add_arguments(parser, pm)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}; block it with -p no:{info.plugin}"
        _stub(sub, info.name, f"plugin {info.plugin!r}: command {info.name!r} failed: {error}")


def _stub(sub: Any, name: str, error: str) -> None:
    """Command ``name`` as one that only says ``error`` (exit 2), whatever it is given."""
    stub = _Parser(prog=f"python -m mprl {name}", add_help=False, prefix_chars="\0")
    stub.add_argument("rest", nargs="*")  # no prefix: -x and --help are words to it
    stub.set_defaults(command_error=error)
    if name not in sub.choices:
        sub.add_parser(name, help=f"(unusable: {error.split(';')[0]})")
    sub.choices[name] = stub


def _add_run(sub: Any, common: argparse.ArgumentParser, options: RunOptions) -> None:
    run = sub.add_parser(
        "run", parents=[common], add_help=False, help="train an algorithm",
        description="Train an algorithm until the env is solved or --total-steps is reached.",
    )  # fmt: skip
    run.add_argument(
        "-h", "--help", action="store_true", help="show this help (with --plugin: its config)"
    )
    run.add_argument(
        "--plugin",
        help="the algorithm to run, by its name or by the name of a plugin that registers only "
        "one (see `python -m mprl plugins`)",
    )
    run.add_argument(
        "--resume", metavar="RUN_DIR",
        help="continue RUN_DIR (or a checkpoint file) from its last checkpoint; flags and --set "
        "given with it override the checkpoint's",
    )  # fmt: skip
    run.add_argument(
        "--resume-drop", dest="resume_drop", action="append", default=[],
        metavar="FIELD[,FIELD...]",
        help="with --resume: start these shared-state fields as declared, their saved data "
        "dropped; needed for a field that cannot be fitted to another --workers (repeatable)",
    )  # fmt: skip
    run.add_argument("--run-dir", help="run directory (default: runs/PLUGIN-ENV-TIME-PID)")
    _add_config(
        run, options, "set an algorithm config field (repeatable), e.g. --set lr=0.0005",
        "run options{of} (also settable in the [run] table)",
    )  # fmt: skip
    run.add_argument("--quiet", "-q", action="store_true", help="no progress display")
    run.add_argument(
        "--serial", action="store_true",
        help="debug: run the workers and train process in this process, taking turns (same as "
        "--backend serial): nothing spawned, repeatable for a seed, breakpoint() works",
    )  # fmt: skip


def add_run_arguments(
    parser: argparse.ArgumentParser,
    plugins: PluginManager,
    set_help: str = "set an algorithm config field for every run (repeatable)",
    title: str = "run options{of}, for every run",
) -> None:
    """``--config``, ``--set`` and every run option (``--env``, ``--workers`` ... and those
    plugins register) as ``run`` takes them, for a plugin's command that starts runs (``sweep``);
    read them back with :func:`run_inputs`."""
    _add_config(parser, plugins.run_options(), set_help, title)


def run_inputs(
    args: argparse.Namespace, plugins: PluginManager
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The algorithm config and run options of the flags :func:`add_run_arguments` added, each
    checked where it came from (an error names the file or the flag)."""
    return _run_inputs(args, plugins.run_options())


def _add_config(
    parser: argparse.ArgumentParser, options: RunOptions, set_help: str, title: str
) -> None:
    """``--config``, ``--set`` and every run option, grouped by the plugin that registers them
    (``title``'s ``{of}``: `` of plugin NAME``, nothing for the core's)."""
    parser.add_argument(
        "--config", metavar="FILE.toml", help="algorithm config; a [run] table sets run options"
    )
    parser.add_argument(
        "--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE",
        help=set_help,
    )  # fmt: skip
    for owner, rows in options.groups():
        of = "" if owner == "mprl" else f" of plugin {owner}"
        _add_options(parser.add_argument_group(title.format(of=of)), rows)


def _add_options(group: Any, rows: list[tuple[str, str, str, str]]) -> None:
    """A flag per run option (``--total-steps``), stored as ``run_NAME``."""
    for name, type_name, default, text in rows:
        flag = "--" + name.replace("_", "-")
        if type_name == "bool":  # a switch; None when absent, so a [run] table or checkpoint holds
            group.add_argument(
                flag, dest=f"run_{name}", action="store_true", default=None, help=text
            )
            continue
        group.add_argument(
            flag, dest=f"run_{name}", metavar=type_name.split(" | ")[0].upper(),
            help=f"{text} [default {default}]" if "default" not in text else text,
        )  # fmt: skip


def _add_plot(sub: Any) -> None:
    plot = sub.add_parser(
        "plot", help="plot learning curves of run directories",
        description="Plot the mean return of the last N episodes vs env steps and vs wall time, "
        "one line per run, or the IQM across the seeds of each configuration with its 95% "
        "bootstrap band, with the env's reward threshold. Needs matplotlib "
        '(pip install "mprl[plot]"), and rliable for the bands (pip install "mprl[stats]").',
    )  # fmt: skip
    plot.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories to overlay")
    plot.add_argument(
        "-o", "--out", default="learning_curves.png", metavar="FILE",
        help="image to write; the format follows the suffix (.png, .svg, .pdf) "
        "[default learning_curves.png]",
    )  # fmt: skip
    plot.add_argument(
        "--label", dest="labels", action="append", metavar="NAME",
        help="legend label, one per RUN_DIR in order (repeatable) [default: directory names]",
    )  # fmt: skip
    plot.add_argument(
        "--window", type=int, default=100, metavar="N",
        help="episodes in the moving mean of returns [default 100]",
    )  # fmt: skip
    plot.add_argument(
        "--per-run", action="store_true",
        help="one line per run; by default the seeds of one configuration (plugin, env, "
        "config) are drawn as their IQM with a 95%% bootstrap band (needs rliable: "
        'pip install "mprl[stats]")',
    )  # fmt: skip
    plot.add_argument(
        "--metric", dest="metrics", action="append", default=[], metavar="NAME",
        help="plot this logged value instead of the return (repeatable), e.g. tom_accuracy, "
        "policy_loss; 'agents': each agent's return of a multi-agent run; 'teams': each "
        "team's (agents named adversary_0, adversary_1 play for adversary)",
    )  # fmt: skip


def _add_eval(sub: Any, common: argparse.ArgumentParser) -> None:
    ev = sub.add_parser(
        "eval", parents=[common], help="play a trained policy and measure it",
        description="Play episodes with the policy of a run's last checkpoint (or of a checkpoint "
        "file); print mean ± std return and length and write them as JSON.",
    )  # fmt: skip
    ev.add_argument("source", metavar="RUN_DIR|CHECKPOINT", help="run directory or .pt file")
    ev.add_argument("--episodes", type=int, default=10, help="episodes to play [default 10]")
    ev.add_argument(
        "--deterministic", action="store_true",
        help="take the most likely action (argmax / Gaussian mean) instead of sampling",
    )  # fmt: skip
    ev.add_argument("--seed", type=int, default=0, help="seed of the episodes [default 0]")
    ev.add_argument(
        "--env", default=None,
        help="the checkpoint's env id; needed, as trust, for an id that imports a module "
        "(module:Env-v0)",
    )  # fmt: skip
    ev.add_argument(
        "--video", metavar="DIR", default=None,
        help='record every episode as a video in DIR (needs pip install "gymnasium[other]")',
    )  # fmt: skip
    ev.add_argument(
        "--out", metavar="FILE", default=None,
        help="JSON to write [default: RUN_DIR/eval.json]",
    )  # fmt: skip


def _plugin_help(pm: PluginManager, name: str) -> str:
    plugin_name, algo = pm.algorithm(name)
    dist, version = pm.distribution_of(plugin_name)
    lines = [
        "",
        f"algorithm {algo.name!r} from plugin {plugin_name} ({dist} {version}): {algo.description}",
        f"default env: {algo.default_env}; action spaces: "
        + ", ".join(t.__name__ for t in algo.action_spaces),
        "config fields (set with --set KEY=VALUE or in --config FILE.toml):",
    ]
    if algo.run_defaults:  # the run options it sets where the user gives none
        given = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in algo.run_defaults.items())
        lines.insert(-1, f"its run options unless given: {given}")
    rows = describe_fields(algo.config_cls)
    width = max((len(f"{n} ({t})") for n, t, _, _ in rows), default=0)
    for field_name, type_name, default, text in rows:
        head = f"{field_name} ({type_name})".ljust(width)
        lines.append(f"  {head}  default {default}. {text}")
    return "\n".join(lines)


def _cmd_run(args: argparse.Namespace, parser: argparse.ArgumentParser, pm: PluginManager) -> int:
    from mprl.host.runner import run

    if args.help:
        run_parser = parser._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
        text = run_parser.format_help()
        if args.plugin:
            text += _plugin_help(pm, args.plugin)
        else:
            text += "\nGive --plugin NAME with --help to list that algorithm's config fields."
        print(text)
        return 0
    if not args.plugin and not args.resume:
        installed = ", ".join(sorted(pm.algorithms())) or "none"
        raise UsageError(f"run needs --plugin NAME (or --resume RUN_DIR); installed: {installed}")
    config, options = _run_inputs(args, pm.run_options())
    try:
        summary = run(
            args.plugin, config=config, run_dir=args.run_dir, resume=args.resume,
            resume_drop=",".join(args.resume_drop),
            # a live panel would redraw over a breakpoint()'s prompt: plain lines when serial
            progress="none" if args.quiet else "plain" if args.serial else "auto",
            plugins=pm, **options,
        )  # fmt: skip
    except RunFailed as exc:
        say(f"mprl: run failed: {exc}", sys.stderr)  # never raises: nobody may be reading
        return EXIT_FAILED
    say(_final_line(summary), sys.stdout)
    return summary.exit_code


def _run_inputs(
    args: argparse.Namespace, known: RunOptions
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The algorithm config and run options of ``run``'s flags and ``--config`` file, each
    checked where it came from, so an error names the file or the flag; flags win."""
    config: dict[str, Any] = {}
    table: dict[str, Any] = {}
    if args.config:
        data = load_toml(args.config)
        table = data.pop("run", {})
        if not isinstance(table, dict):
            raise UsageError(f"config file {args.config!r}: [run] must be a table")
        config.update(data)
    config.update(parse_assignments(args.assignments))
    flags = {}
    for name in known.names:
        text = getattr(args, f"run_{name}")
        if text is not None:
            flags[name] = text if known.field(name).type in (str, bool) else parse_value(text)
    if getattr(args, "serial", False):
        if flags.get("backend", "serial") != "serial":
            raise UsageError(f"--serial and --backend {flags['backend']} contradict each other")
        flags["backend"] = "serial"
    from_file = known.check(table, f"config file {args.config!r} [run]") if table else {}
    return config, {**from_file, **known.check(flags, "run option")}


def _final_line(s: Summary) -> str:
    mean = "-" if s.mean_return_100 is None else f"{s.mean_return_100:.1f}"
    verdict = "solved" if s.solved else s.stop_reason
    if s.solved_at:  # the moment it was solved: episodes kept finishing while the run stopped
        at = s.solved_at
        if "eval_return_mean" in at:  # solved on evaluation episodes (--eval-every)
            judged = f"eval return {at['eval_return_mean']:.1f}"
        else:
            judged = f"mean return(100) {at['mean_return_100']:.1f}"
        verdict = f"solved after {at['wall_s']:.1f} s, {at['env_steps']:,} env steps: {judged}"
    failed = s.checkpoint_failures
    return (
        f"mprl: {s.status} ({verdict}) after {s.wall_s:.1f} s: {s.env_steps:,} env steps, "
        f"{s.episodes:,} episodes, mean return(100) {mean}"
        + (f"; {failed:,} checkpoint write{'s' * (failed > 1)} failed" if failed else "")
        + f"; run directory: {s.run_dir}"
    )


def _cmd_plugins(args: argparse.Namespace, pm: PluginManager) -> int:
    commands = pm.commands(reserved=CORE_COMMANDS)
    infos = pm.info()
    if args.json:
        data = {
            "plugins": [attrs.asdict(i) for i in infos],
            "failed": [attrs.asdict(f) for f in pm.failed],
            "conflicts": pm.conflicts,
            "plugin_conflicts": {n: c.owners for n, c in pm.plugin_conflicts.items()},
            "blocked": pm.blocked_names(),
            "backends": {
                b.name: {"plugin": b.plugin, "description": b.description}
                for b in pm.backends().values()
            },
            "commands": {c.name: {"plugin": c.plugin, "help": c.help} for c in commands.values()},
            "command_conflicts": pm.command_conflicts,
        }
        print(json.dumps(data, indent=2))
        return 0
    registered = pm.algorithms()

    def label(name: str) -> str:
        algo = registered[name][1] if name in registered else None
        return f"{name} (multi-agent)" if algo is not None and algo.agents == "multi" else name

    for info in infos:
        algos = ", ".join(map(label, info.algorithms)) or "-"
        print(f"{info.name}  ({info.distribution} {info.version})")
        print(f"    algorithms: {algos}")
        if info.backends:
            print(f"    backends:   {', '.join(info.backends)}")
        if info.commands:
            print(f"    commands:   {', '.join(info.commands)}")
        print(f"    hooks:      {', '.join(info.hooks)}")
    print("backends (--backend NAME):")
    for backend in sorted(pm.backends().values(), key=lambda b: b.name):
        print(f"    {backend.name:<10} {backend.description}  [{backend.plugin}]")
    if commands:
        print("commands (python -m mprl NAME):")
    for command in sorted(commands.values(), key=lambda c: c.name):
        print(f"    {command.name:<10} {command.help}  [{command.plugin}]")
    for failed in pm.failed:
        print(f"FAILED {failed.message()}")
    for message in pm.conflict_messages():
        print(f"CONFLICT {message}")
    for name, owners in sorted(pm.command_conflicts.items()):
        print(f"CONFLICT command {name!r} is registered by {' and '.join(owners)}")
    for name in pm.blocked_names():
        print(f"blocked: {name}")
    return 0


def _skipped(lines: Sequence[str]) -> None:
    """One line on stderr per file of a run directory that ``runs`` or ``plot`` left out."""
    from mprl.tools.report import shown

    for line in lines:
        say(f"mprl: skipped {shown(line)}")


def _cmd_plot(args: argparse.Namespace) -> int:
    from mprl.tools.aggregate import seeds_figure
    from mprl.tools.report import plot_runs, shown

    skipped: list[str] = []
    notes: list[str] = []
    try:
        out = plot_runs(
            args.run_dirs, args.out, labels=args.labels, window=args.window,
            metrics=args.metrics, skipped=skipped,
            across_seeds=None if args.per_run else partial(seeds_figure, notes=notes),
        )  # fmt: skip
    finally:
        _skipped(skipped)
    for note in notes:
        say(f"mprl: {note}")
    print(f"mprl: wrote {shown(out)}")
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from mprl.tools.evaluate import evaluate

    r = evaluate(
        args.source, episodes=args.episodes, deterministic=args.deterministic, seed=args.seed,
        video_dir=args.video, out=args.out, env=args.env,
        plugins=get_plugin_manager(blocked=_blocked(args.plugin_options)),
    )  # fmt: skip
    from mprl.tools.report import shown  # what the checkpoint named (its env), escaped

    how = "deterministic" if r["deterministic"] else "sampled actions"
    print(
        shown(
            f"{r['algorithm']} on {r['env']}, {r['episodes']} episodes ({how}): "
            f"return {r['mean_return']:.1f} ± {r['std_return']:.1f}, "
            f"length {r['mean_length']:.1f} ± {r['std_length']:.1f}; "
            f"written to {r['written_to']}"
            + (f"; videos in {r['video_dir']}" if r["video_dir"] else "")
        )
    )
    if r.get("agents"):  # a multi-agent env: the return above is the team's (agents' mean)
        each = ", ".join(f"{a} {v['mean_return']:.1f}" for a, v in r["agents"].items())
        print(f"    per agent: {shown(each)}")
    if r.get("teams"):  # a competitive env: what each side scored
        each = ", ".join(f"{t} {v['mean_return']:.1f}" for t, v in r["teams"].items())
        print(f"    per team: {shown(each)}")
    return 0


def _cmd_runs(args: argparse.Namespace) -> int:
    from mprl.tools.report import format_runs, list_runs

    skipped: list[str] = []
    rows = list_runs(args.directory, skipped)
    _skipped(skipped)
    print(format_runs(rows, args.directory))
    return 0


def _plugins_for(argv: Sequence[str]) -> PluginManager | None:
    """The plugin manager the command line is read with (``-p no:NAME`` applied): ``run``'s
    options and the plugins' commands are its. ``None`` for the core commands that need
    none of it (``plot``, ``runs``, ``eval``)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("command", nargs="?")
    pre.add_argument("-p", dest="plugin_options", action="append", default=[])
    known, _ = pre.parse_known_args(argv)
    if known.command in ("plot", "runs", "eval"):
        return None
    return get_plugin_manager(blocked=_blocked(known.plugin_options))


def _parse(
    parser: argparse.ArgumentParser, argv: Sequence[str], pm: PluginManager | None
) -> argparse.Namespace:
    """``argv`` read; an unknown command names the plugins that failed to load (one may have
    been meant to provide it), a plugin's command that cannot run says why."""
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        failed = pm.failed if pm is not None and "invalid choice" in str(exc) else []
        raise UsageError("; ".join([str(exc), *(f.message() for f in failed)])) from None
    if getattr(args, "command_error", None):
        raise UsageError(args.command_error)
    return args


def _show_deprecations() -> None:
    """Python shows no DeprecationWarning raised outside ``__main__``: a user of the command line
    sees mprl's, one line each (an old config field name in ``--set``, a TOML file, the config
    of a resumed run)."""
    show = warnings.showwarning
    if getattr(show, "mprl_one_line", False):  # main() called again in this process
        return

    def one_line(message: Warning | str, category: type[Warning], *args: Any, **kw: Any) -> None:
        if issubclass(category, MprlDeprecationWarning):
            print(f"mprl: warning: {message}", file=sys.stderr)
        else:
            show(message, category, *args, **kw)

    one_line.mprl_one_line = True  # type: ignore[attr-defined]
    warnings.showwarning = one_line
    if not sys.warnoptions:  # python -W ... decides for itself
        warnings.filterwarnings("default", category=MprlDeprecationWarning)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # a reader gone (`mprl plugins | head`, a closed terminal) ends no command with a traceback:
    # what is printed after that is dropped, as a run's output is (SafeStream)
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _never_raising(out), _never_raising(err)
    try:
        # a Ctrl-C from here on is a KeyboardInterrupt, said below (before: `python -m mprl`
        # ends as interrupted, mprl.startup.guard_interrupts)
        startup.entering_main()
        mark("main")
        _show_deprecations()
        pm = _plugins_for(argv)
        mark("plugins")
        parser = _parser(pm)
        args = _parse(parser, argv, pm)
        if args.command == "plot":
            return _cmd_plot(args)
        if args.command == "eval":
            return _cmd_eval(args)
        if args.command == "runs":
            return _cmd_runs(args)
        assert pm is not None
        if args.command == "run":
            return _cmd_run(args, parser, pm)
        if args.command == "plugins":
            return _cmd_plugins(args, pm)
        code = args.plugin_command.run(args, pm)
        return 0 if code is None else int(code)
    except UsageError as exc:
        text = str(exc)
        if argv[:1] in (["plot"], ["runs"], ["eval"]):  # may hold what a file says: escaped
            from mprl.tools.report import shown

            text = shown(text)
        print(f"mprl: error: {text}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        startup.leaving_main()  # one more Ctrl-C: the exit goes on
        print(startup.INTERRUPTED, file=sys.stderr)
        return 130
    finally:
        startup.leaving_main()
        sys.stdout, sys.stderr = out, err


def _never_raising(stream: Any) -> SafeStream:
    return stream if isinstance(stream, SafeStream) else SafeStream(stream)
