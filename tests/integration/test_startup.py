"""Start-up as a measured cost (benchmarks/startup.py reads what these check): ``import mprl``
loads no torch; ``python -m mprl run`` forks its children's forkserver from itself as soon as it
has imported torch (no second interpreter importing it again); mprl's Adam is built and used without ``torch._dynamo``; the run's timeline marks come
in order from every process; and a forkserver started early for a run that does not use it is
stopped as soon as the run's backend is known; a Ctrl-C while the command imports ends it as
interrupted, with nothing left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import (
    alive,
    child_pids,
    cli,
    comm,
    end,
    running,
    stepped,
    wait_for_metrics,
    wait_until,
)


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )


def test_import_mprl_loads_no_torch_and_its_names_load_on_first_use():
    done = _python("""
        import sys
        import mprl
        assert "torch" not in sys.modules, "import mprl imported torch"
        assert "mprl.host.runner" not in sys.modules
        from mprl import Algorithm, Context, schema, hookimpl
        assert Algorithm.__module__ == "mprl.algorithm" and Context.__module__ == "mprl.context"
        assert schema.Schema is mprl.schema.Schema and callable(mprl.run) and callable(mprl.load)
        assert "torch" in sys.modules
        print("ok")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_mprl_adam_is_built_stepped_and_saved_without_importing_torch_dynamo():
    done = _python("""
        import sys
        import torch
        from mprl.lib.nets import Adam
        from mprl_builtin.mappo.algorithm import MAPPOConfig, make_optimizer
        model = torch.nn.Linear(4, 2)
        for opt in (Adam(model.parameters(), lr=1e-3, fused=True),
                    make_optimizer(model.parameters(), MAPPOConfig())):
            model(torch.randn(3, 4)).sum().backward()
            before = model.weight.detach().clone()
            opt.step()
            opt.zero_grad()
            assert not torch.equal(before, model.weight)
            opt.load_state_dict(opt.state_dict())
        assert "torch._dynamo" not in sys.modules, "torch._dynamo was imported"
        print("ok")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def _marks(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_children_fork_from_a_server_started_before_the_cli_imported_the_rest(tmp_path):
    timeline, run_dir = tmp_path / "timeline.jsonl", tmp_path / "run"
    done = cli(
        "run", "--plugin", "a3c", "--workers", "2", "--total-steps", "400", "--quiet",
        "--run-dir", str(run_dir), env={"MPRL_TIMELINE": str(timeline)}, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    marks = _marks(timeline)
    at = {m["mark"]: m for m in reversed(marks)}  # the first of each
    order = ["forkserver", "main", "plugins", "prepared", "state", "launch", "child-main",
             "child-ready", "env-step", "stopping", "stopped", "released", "finished"]  # fmt: skip
    times = [at[name]["t"] for name in order]
    gaps = [(n, round(t - times[0], 3)) for n, t in zip(order, times, strict=True)]
    assert times == sorted(times), gaps
    server = at["forkserver"]["server"]
    children = [m for m in marks if m["mark"] == "child-main"]
    assert {m["source"] for m in children} == {"worker:0", "worker:1"}
    assert {m["ppid"] for m in children} == {server}  # forked by the early server
    main = at["main"]["pid"]
    assert all(m["pid"] == main for m in marks if m["mark"] in ("launch", "finished"))
    updated = {m["source"] for m in marks if m["mark"] == "update"}  # on a busy machine one
    assert updated and updated <= {"worker:0", "worker:1"}  # worker may do the 400 steps alone
    assert not alive(server)  # the run stopped it


def test_the_early_server_is_a_fork_of_the_main_process_and_ends_with_it(tmp_path):
    """The forkserver of ``python -m mprl run`` is the main process forked (its command line,
    its child), not a new interpreter that imports torch a second time; the run's workers are
    its children, and a main process killed with SIGKILL takes it along (its pipe closes)."""
    run_dir = tmp_path / "run"
    args = ["--plugin", "a3c", "--workers", "2", "--total-steps", "10000000", "--quiet",
            "--run-dir", str(run_dir)]  # fmt: skip
    with running(args) as proc:
        wait_for_metrics(run_dir, stepped)
        (server,) = [p for p in child_pids(proc.pid) if comm(p) == "mprl-forkserver"]
        assert _cmdline(server) == _cmdline(proc.pid)  # forked: it ran no new program
        assert _parent(server) == proc.pid
        workers = {comm(p) for p in child_pids(server)}
        assert {"mprl-worker-0", "mprl-worker-1"} <= workers
        proc.kill()
        wait_until(lambda: not alive(server), "the server gone with the main process", 30)


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_server_started_early_for_a_run_on_another_backend_is_stopped_once_it_is_known(
    tmp_path,
):
    """The command line says nothing of the backend; the config file names the serial one."""
    config, timeline = tmp_path / "serial.toml", tmp_path / "timeline.jsonl"
    config.write_text('[run]\nbackend = "serial"\nworkers = 1\n')
    run_dir = tmp_path / "run"
    args = ["--plugin", "a3c", "--config", str(config), "--total-steps", "10000000", "--quiet",
            "--run-dir", str(run_dir)]  # fmt: skip
    env = {**os.environ, "MPRL_TIMELINE": str(timeline)}
    with running(args, env=env) as proc:
        wait_for_metrics(run_dir)  # it runs, serially
        server = next(m["server"] for m in _marks(timeline) if m["mark"] == "forkserver")
        wait_until(lambda: not alive(server), "the unused forkserver to stop", timeout=30)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
    assert "launch" not in {m["mark"] for m in _marks(timeline)}  # serial: no child processes


def test_a_command_refused_before_its_run_stops_the_early_server_as_it_exits(tmp_path):
    timeline = tmp_path / "timeline.jsonl"
    done = cli("run", "--plugin", "nosuch", env={"MPRL_TIMELINE": str(timeline)})
    assert done.returncode == 2 and "unknown plugin/algorithm 'nosuch'" in done.stderr
    (server,) = [m["server"] for m in _marks(timeline) if m["mark"] == "forkserver"]
    assert not alive(server)  # gone with the command: nothing of it outlives exit 2


def _default_terminal_signals() -> None:
    """A Ctrl-C and a hang-up at their defaults in the command, however the suite was started
    (``nohup``, a background job of a script: ignored there, and so in what it starts)."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def test_a_ctrl_c_while_the_command_imports_ends_it_as_interrupted_with_nothing_left(tmp_path):
    """A Ctrl-C to the command's group while it imports torch (the early start, which then forks
    the forkserver): no KeyboardInterrupt traceback out of an import, one line, exit 130; the
    server is stopped as on any exit (the leftover check: no process, no temp dir)."""
    timeline, run_dir = tmp_path / "timeline.jsonl", tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mprl", "run", "--plugin", "a3c", "--workers", "1", "--quiet",
         "--total-steps", "10000000", "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=_default_terminal_signals, env={**os.environ, "MPRL_TIMELINE": str(timeline)},
    )  # fmt: skip
    try:
        wait_until(lambda: _loading_torch(proc.pid), "torch being imported", timeout=60)
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        end(proc)
    marks = _marks(timeline)
    # the Ctrl-C was held until the early start was done (its server forked, and stopped as
    # the command exits), and ended it before the CLI's imports did
    assert [m["mark"] for m in marks] == ["forkserver"]
    assert proc.returncode == 130, stderr
    assert stderr == "mprl: interrupted\n", stderr  # no traceback
    assert not alive(marks[0]["server"]) and not run_dir.exists()


def _loading_torch(pid: int) -> bool:
    """Whether process ``pid`` has begun to import torch (its library is mapped)."""
    try:
        return "libtorch_cpu" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def test_a_spawned_manager_server_loads_no_torch():
    """The Ray backend's Manager server is spawned while the actors import torch on the same
    cores: it imports only what it serves (it once took 1.7 s of CPU importing torch)."""
    from mprl.backends.processes import ManagerServer

    server = ManagerServer()  # spawn, as the Ray backend starts it
    try:
        shared = server.manager.dict(a=1)  # it answers: its imports are done
        assert shared.copy() == {"a": 1}
        with open(f"/proc/{server.process.pid}/maps") as f:
            torch_libs = [line for line in f if "libtorch" in line]
        assert not torch_libs, torch_libs[:3]
    finally:
        server.shutdown()
