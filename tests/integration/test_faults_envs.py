"""An env that returns NaN, inf, a string reward or an observation of the wrong shape a few
steps in (after the main process's look at its first step) fails the worker that steps it, the
run failing as for a crash, with one line naming the env, the field and the value: not
"probability tensor contains inf/nan" in the network many steps later."""

from __future__ import annotations

import json
import re

import pytest

import mprl


@pytest.mark.parametrize(
    ("plugin", "env_id", "said"),
    [
        ("a3c", "tests.faulty_envs:Faulty-v0(fault='nan_obs', at=3)",
         r"its observation at step 3 holds nan at index \[1\] .*; expected finite float32 numbers of shape \(3,\)"),
        ("a3c", "tests.faulty_envs:Faulty-v0(fault='inf_reward', at=3)",
         r"its reward at step 3 is inf; expected a finite number"),
        ("a3c", "tests.faulty_envs:Faulty-v0(fault='str_reward', at=3)",
         r"its reward at step 3 is '1\.0' \(str\); expected a number"),
        ("a3c", "tests.faulty_envs:Faulty-v0(fault='obs_shape', at=3)",
         r"its observation at step 3 has shape \(4,\) .*; expected float32 numbers of shape \(3,\)"),
        ("dqn", "tests.faulty_envs:Faulty-v0(fault='nan_reward', at=3)",
         r"its reward at step 3 is nan; expected a finite number"),
        ("mappo", "tests:faulty_envs(fault='nan_reward', at=3)",
         r"its reward of agent 'agent_1' at step 3 is nan; expected a finite number"),
    ],
)  # fmt: skip
def test_an_env_going_bad_in_a_worker_fails_the_run_naming_the_env_and_the_field(
    run_dir, capfd, plugin, env_id, said
):
    with pytest.raises(mprl.RunFailed, match=r"worker 0 exited with code 1") as failed:
        mprl.run(plugin, env=env_id, workers=1, run_dir=run_dir, progress="none")
    assert re.search(said, str(failed.value)) and env_id in str(failed.value)  # the last line too
    stderr = capfd.readouterr().err
    assert "--- traceback of worker 0 ---" in stderr
    line = f"mprl.envcheck.EnvCheckError: environment {env_id!r}: "
    found = [x for x in stderr.splitlines() if x.startswith(line)]
    assert len(found) == 1 and re.search(said, found[0]), stderr
    assert "probability tensor" not in stderr and stderr.count("--- traceback of") == 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["exit_code"] == 1
