"""One BenchMARL MAPPO run on PettingZoo MPE simple_spread within a wall-clock budget.

Run INSIDE the BenchMARL virtual environment (not mprl's), as a subprocess of
``benchmarks/marl.py``; see benchmarks/README.md ("marl.py: mprl mappo against BenchMARL's
MAPPO") for the setup::

    /work/benchmarl-venv/bin/python benchmarks/_benchmarl_run.py --seed 0 --budget-s 60 \
        --out /tmp/bm.json

What runs: ``PettingZooTask.SIMPLE_SPREAD`` (torchrl's ``PettingZooEnv``, parallel API, one
group ``agent`` of 3 agents) with its task config but ``max_cycles=25`` (BenchMARL's yaml says
100; 25 is PettingZoo's default and mprl's) and discrete actions
(``prefer_continuous_actions=False``; BenchMARL's default prefers continuous); BenchMARL's
default MAPPO (``conf/algorithm/mappo.yaml``), default MLP actor and critic
(``conf/model/layers/mlp.yaml``: 256-256 Tanh) and default experiment config
(``conf/experiment/base_experiment.yaml``: 6000 frames a batch over 10 serial envs, 45 passes of
400-frame minibatches, lr 5e-5, gamma 0.99, on the CPU) with only these changed: no loggers, no
evaluation, no rendering, no json, no checkpoints, and ``max_n_frames`` so large that the wall
clock stops the run.

PettingZoo >= 1.25 no longer ships MPE (it moved to the ``mpe2`` package), and torchrl finds
``simple_spread_v3`` only among ``pettingzoo.utils.all_modules.all_environments``; where it is
not there, this adds ``mpe2.simple_spread_v3`` to that table (the same package and version that
mprl's ``mpe2:simple_spread_v3`` plays), and the output's ``env_module`` says which module ran.

The clock (``wall_s``) starts after the imports, before the experiment (its envs, networks and
collector) is built, as mprl's starts before its processes are spawned; ``import_s`` is what
came before. A callback records, at each collection iteration, the wall seconds when the batch
was collected, the env steps (BenchMARL's frames: one frame is one step of the whole team) so
far, and the team returns of the episodes that finished in the batch. The team return is what
BenchMARL logs as ``collection/reward/episode_reward_mean``: each agent's episode return
(torchrl's ``RewardSum``), the mean over the agents of the group, then over the groups (one
here). A batch collected after the budget is dropped and the run stops; the run also stops when
a training phase ends past the budget. The JSON is rewritten after every iteration, so a killed
run leaves what it had.

``--torch-threads`` sets torch's threads (default: torch's own); on a loaded 2-core machine one
thread collects three times as fast as two (see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

PROCESS_START = time.monotonic()

import torch  # noqa: E402
from benchmarl.algorithms import MappoConfig  # noqa: E402
from benchmarl.environments import PettingZooTask  # noqa: E402
from benchmarl.experiment import Experiment, ExperimentConfig  # noqa: E402
from benchmarl.experiment.callback import Callback  # noqa: E402
from benchmarl.models.mlp import MlpConfig  # noqa: E402

TASK_CONFIG = {"max_cycles": 25, "N": 3, "local_ratio": 0.5}


class BudgetReached(Exception):
    """The wall-clock budget is spent: ends the experiment's loop."""


def env_module(task: str = "simple_spread_v3") -> str:
    """The module torchrl's PettingZooEnv will build ``task`` from: PettingZoo's own MPE where
    it has one (PettingZoo < 1.25), else mpe2's, which this adds to the table torchrl looks in
    (``pettingzoo.utils.all_modules.all_environments``, or where that does not import, as
    without PettingZoo's Atari extras, what torchrl's ``_load_available_envs`` returns)."""
    try:
        from pettingzoo.utils.all_modules import all_environments
    except ImportError:
        all_environments = None
    if all_environments is not None:
        for name, module in all_environments.items():
            if task in (name, module.__name__.split(".")[-1]):
                return module.__name__
    try:
        from pettingzoo.mpe import simple_spread_v3 as module
    except ImportError:  # PettingZoo >= 1.25: "MPE has been moved into its own package: MPE2"
        import mpe2
        from mpe2 import simple_spread_v3 as module

        module.__version__ = mpe2.__version__
    if all_environments is not None:
        all_environments[f"mpe/{task}"] = module
    else:
        from torchrl.envs.libs import pettingzoo as torchrl_pettingzoo

        torchrl_pettingzoo._load_available_envs = lambda: {f"mpe/{task}": module}
    version = getattr(module, "__version__", None)
    return module.__name__ + (f" (mpe2 {version})" if version else "")


class Recorder(Callback):
    """Writes the curve after every collection iteration; stops the run at the budget."""

    def __init__(self, out: str, start: float, budget_s: float, result: dict) -> None:
        super().__init__()
        self.out, self.start, self.budget_s, self.result = out, start, budget_s, result
        self.frames = 0
        self.mark = start

    def now(self) -> float:
        return time.monotonic() - self.start

    def on_batch_collected(self, batch) -> None:
        wall = self.now()
        if wall > self.budget_s:
            self.result["stop"] = "a batch collected after the budget (dropped)"
            raise BudgetReached
        self.frames += batch.numel()
        done = batch.get(("next", "done")).squeeze(-1)  # [envs, time]
        returns = [
            batch.get(("next", group, "episode_reward")).mean(-2).squeeze(-1)  # over agents
            for group in self.experiment.group_map
        ]
        team = torch.stack(returns).mean(0)  # over groups
        if done.ndim == 2:  # time-major, so the episodes are in the order they finished
            done, team = done.T, team.T
        finished = team[done].tolist()
        self.result["curve"].append(
            {
                "wall_s": round(wall, 3),
                "env_steps": self.frames,
                "episodes": len(finished),
                "team_return_mean": sum(finished) / len(finished) if finished else None,
                "team_returns": [round(r, 4) for r in finished],
                "collect_s": round(time.monotonic() - self.mark, 3),
            }
        )
        self.mark = time.monotonic()
        self.save()

    def on_train_end(self, training_td, group: str) -> None:
        curve = self.result["curve"]
        if curve:
            curve[-1]["train_s"] = round(time.monotonic() - self.mark, 3)
        self.mark = time.monotonic()
        if self.now() > self.budget_s:
            self.result["stop"] = "training ended past the budget"
            raise BudgetReached

    def save(self) -> None:
        curve = self.result["curve"]
        self.result["env_steps"] = self.frames
        self.result["wall_s"] = curve[-1]["wall_s"] if curve else 0.0
        tmp = self.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.result, f)
        os.replace(tmp, self.out)


def build(seed: int, callbacks: list) -> Experiment:
    config = ExperimentConfig.get_from_yaml()
    config.loggers = []
    config.create_json = False
    config.evaluation = False
    config.render = False
    config.checkpoint_interval = 0
    config.checkpoint_at_end = False
    config.prefer_continuous_actions = False  # discrete actions, as mprl's run
    config.max_n_frames = 10**12  # the wall clock stops the run
    config.sampling_device = config.train_device = config.buffer_device = "cpu"
    config.save_folder = None
    task = PettingZooTask.SIMPLE_SPREAD.get_from_yaml()
    task.config.update(TASK_CONFIG)
    return Experiment(
        task=task,
        algorithm_config=MappoConfig.get_from_yaml(),
        model_config=MlpConfig.get_from_yaml(),
        critic_model_config=MlpConfig.get_from_yaml(),
        seed=seed,
        config=config,
        callbacks=callbacks,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget-s", type=float, required=True)
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--save-folder", default=None, help="BenchMARL's folder (default: tmp)")
    parser.add_argument(
        "--torch-threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)"
    )
    args = parser.parse_args(argv)
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    start = time.monotonic()
    result = {
        "system": "benchmarl",
        "seed": args.seed,
        "budget_s": args.budget_s,
        "import_s": round(start - PROCESS_START, 3),
        "env_module": env_module(),
        "task": "PettingZooTask.SIMPLE_SPREAD",
        "task_config": None,
        "continuous_actions": None,
        "torch_threads": torch.get_num_threads(),
        "curve": [],
        "stop": None,
    }
    recorder = Recorder(args.out, start, args.budget_s, result)
    if args.save_folder:
        os.makedirs(args.save_folder, exist_ok=True)
        os.chdir(args.save_folder)  # BenchMARL's folder defaults to the current one
    else:
        import tempfile

        os.chdir(tempfile.mkdtemp(prefix="benchmarl-"))
    experiment = build(args.seed, [recorder])
    result["setup_s"] = round(time.monotonic() - start, 3)
    result["task_config"] = dict(experiment.task.config)
    result["continuous_actions"] = experiment.continuous_actions
    result["group_map"] = {g: list(a) for g, a in experiment.group_map.items()}
    result["frames_per_batch"] = experiment.config.collected_frames_per_batch(True)
    result["n_envs"] = experiment.config.n_envs_per_worker(True)
    try:
        experiment.run()
    except BudgetReached:  # the callback's stop at the budget
        pass
    except KeyboardInterrupt:  # marl.py's, past the budget and its grace
        result["stop"] = "interrupted (SIGINT)"
    result["stopped_s"] = round(recorder.now(), 3)  # the clock when it stopped
    recorder.save()
    print(
        f"benchmarl seed {args.seed}: {result['env_steps']} env steps in {result['wall_s']} s, "
        f"{len(result['curve'])} iterations; stop: {result['stop']}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
