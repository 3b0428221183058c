"""EnvPool (``--env-batch envpool``): a worker's environments stepped in C++ by one EnvPool
instead of one gymnasium env at a time, behind the same env ids, for
:class:`mprl.lib.envbatch.EnvBatch`; the env room refuses the option where it cannot work.

Supported: gymnasium's classic-control ids that EnvPool has (``CartPole-v1``, ``Pendulum-v1``,
...) and Atari (``ALE/Pong-v5``, ``PongNoFrameskip-v4``), the Atari ones set up as
:func:`mprl.environments.atari.make_atari` sets gymnasium's up: 30 no-op starts, 4 frames a
step, grey 84x84, 4 stacked, no fire on reset, sticky actions 0.25 for ``-v5`` and none for
``NoFrameskip-v4``, rewards clipped for learning while the raw score is logged. MuJoCo ids are
not, whatever their version: EnvPool's MuJoCo envs are its own builds of them, not gymnasium's.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from typing import Any

from mprl.errors import UsageError

INSTALL = 'pip install "mprl[envpool]"'

#: classic-control envs EnvPool has in the versions gymnasium has
CLASSIC = frozenset(
    {"CartPole-v1", "Pendulum-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0"}
)
_ATARI = re.compile(r"^(?:ALE/(?P<v5>[A-Za-z]+)-v5|(?P<v4>[A-Za-z]+)NoFrameskip-v4)$")


def pool_spec(env_id: str) -> tuple[str, dict[str, Any]] | None:
    """EnvPool's id and settings for gymnasium's ``env_id``; ``None`` if it has no such env."""
    import envpool

    atari = _ATARI.match(env_id)
    if atari:
        game = atari["v5"] or atari["v4"]
        task = f"{game}-v5"
        if task not in envpool.list_all_envs():
            return None
        sticky = 0.25 if atari["v5"] else 0.0
        return task, {
            "repeat_action_probability": sticky, "use_fire_reset": False, "noop_max": 30,
            "frame_skip": 4, "stack_num": 4, "img_height": 84, "img_width": 84,
            "gray_scale": True, "episodic_life": False, "reward_clip": True,
            "max_episode_steps": 27_000,
        }  # fmt: skip
    if env_id in CLASSIC:
        return env_id, {}
    return None


def check(env_id: str) -> None:
    """Refuse ``--env-batch envpool`` where it cannot work, saying what does."""
    try:
        import envpool
    except ImportError:
        raise UsageError(f"--env-batch envpool: EnvPool is not installed: {INSTALL}") from None
    if pool_spec(env_id) is not None:
        return
    what = "mprl steps classic-control and Atari envs with EnvPool"
    if env_id in envpool.list_all_envs():  # MuJoCo's, dm_control's, ...: not gymnasium's own
        raise UsageError(
            f"--env-batch envpool: {what}, not {env_id!r} (EnvPool's own build of it is not "
            "gymnasium's); use --env-batch gym"
        )
    raise UsageError(
        f"--env-batch envpool: EnvPool has no {env_id!r} ({what}); use --env-batch gym"
    )


def make_pool(env_id: str, seeds: Sequence[int], **settings: Any) -> Any:
    """One EnvPool of ``len(seeds)`` envs of ``env_id``, env ``i`` seeded with ``seeds[i]``,
    stepped on one thread (a worker is one process on one core)."""
    import envpool

    spec = pool_spec(env_id)
    if spec is None:
        check(env_id)
    assert spec is not None
    task, defaults = spec
    n = len(seeds)
    with warnings.catch_warnings():  # its float64 Box bounds, cast to float32: harmless
        warnings.simplefilter("ignore", UserWarning)
        return envpool.make(
            task, env_type="gymnasium", num_envs=n, batch_size=n, num_threads=1,
            env_seed=[int(s) for s in seeds], seed=int(seeds[0]), **{**defaults, **settings},
        )  # fmt: skip
