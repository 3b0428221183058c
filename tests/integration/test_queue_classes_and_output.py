"""What docs/reference.md and docs/running.md answer, tried on the local backend: a plugin's own
class goes on a Manager ``Queue`` (the Manager server imports the plugin's module to unpickle
it), one the server cannot import fails the put with its ``ModuleNotFoundError``, and what the
workers and the train process print reaches the terminal of the run."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import cli, write_distribution

PLUGIN = '''
import os
import sys

import attrs
import torch

import mprl
from mprl import schema


class Parcel:
    """A plugin's own class, put on the queue whole."""

    def __init__(self, rank, length):
        self.rank, self.length = rank, length


@attrs.frozen
class Config:
    elsewhere: bool = False  # put a class of a module only the worker can import


def make_model(obs_space, act_space, config):
    return torch.nn.Linear(obs_space.shape[0], act_space.n)


def worker(ctx):
    print(f"worker {ctx.rank} says hello", flush=True)
    print(f"worker {ctx.rank} complains", file=sys.stderr, flush=True)
    parcel = Parcel
    if ctx.config.elsewhere:
        sys.path.insert(0, os.environ["ELSEWHERE"])  # after the Manager server started
        from elsewhere import Stranger as parcel
    env = ctx.make_env()
    env.reset()
    length = 0
    while not ctx.should_stop():
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        ctx.add_steps(1)
        length += 1
        if terminated or truncated:
            ctx.log_episode(float(length), length)
            if not ctx.put(ctx.state.parcels, parcel(ctx.rank, length)):
                return
            env.reset()
            length = 0


def train(ctx):
    print("the trainer says hello", flush=True)
    got = 0
    while (parcel := ctx.get(ctx.state.parcels)) is not None:
        got += 1
        kind = f"{type(parcel).__module__}.{type(parcel).__qualname__}"
        ctx.log(parcels=got, kind=kind, same_class=isinstance(parcel, Parcel))


@mprl.hookimpl
def mprl_register_algorithms(register):
    register(
        mprl.Algorithm(
            name="postbox", config_cls=Config, make_model=make_model, worker=worker,
            train=train, schema=schema.Schema(parcels=schema.Queue("workers")),
        )
    )
'''


def _site(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    write_distribution(site, "mprl-postbox", {"postbox": "mprl_postbox"}, {"mprl_postbox": PLUGIN})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "elsewhere.py").write_text(
        "class Stranger:\n    def __init__(self, rank, length):\n        self.rank = rank\n"
    )
    return {"PYTHONPATH": str(site), "ELSEWHERE": str(elsewhere)}


def test_a_plugins_own_class_goes_on_a_queue_and_prints_reach_the_terminal(tmp_path):
    run_dir = tmp_path / "run"
    done = cli("run", "--plugin", "postbox", "--workers", "2", "--total-steps", "1500",
               "--run-dir", str(run_dir), "--quiet", env=_site(tmp_path), timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        assert f"worker {rank} says hello" in done.stdout
        assert f"worker {rank} complains" in done.stderr
    assert "the trainer says hello" in done.stdout
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    got = [r for r in records if "parcels" in r]
    assert got and {r["kind"] for r in got} == {"mprl_postbox.Parcel"}
    assert all(r["same_class"] for r in got)  # unpickled as the plugin's own class


def test_a_class_the_manager_server_cannot_import_fails_the_put(tmp_path):
    done = cli("run", "--plugin", "postbox", "--workers", "1", "--total-steps", "100000",
               "--set", "elsewhere=true", "--run-dir", str(tmp_path / "run"), "--quiet",
               env=_site(tmp_path), timeout=240)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "worker 0 exited with code 1" in done.stderr
    assert "ctx.put(ctx.state.parcels" in done.stderr  # where, in the worker's traceback
    assert "ModuleNotFoundError: No module named 'elsewhere'" in done.stderr
