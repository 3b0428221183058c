"""Ray's token authentication as this machine has it, in words, for a driver that could not
join a cluster (:func:`mprl_builtin.ray.cluster.unreachable`).

A cluster started with ``RAY_AUTH_MODE=token`` refuses a driver that sends no token, and Ray
(2.5x and later) sends one only where ``RAY_AUTH_MODE=token`` is set in the driver's own
environment: a driver that joins by address never turns it on by itself, even with the token
on its disk. Ray takes the token from ``RAY_AUTH_TOKEN`` (the token itself), else from the file
``RAY_AUTH_TOKEN_PATH`` names (only that file, when it is set), else from
``~/.ray/auth_token``. Nothing here imports Ray.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

MODE = "RAY_AUTH_MODE"
TOKEN = "RAY_AUTH_TOKEN"
TOKEN_PATH = "RAY_AUTH_TOKEN_PATH"


def token_place(
    environ: Mapping[str, str] | None = None, home: Path | None = None
) -> tuple[bool, str]:
    """Whether this machine holds a Ray token, and where Ray takes it from (``RAY_AUTH_TOKEN``,
    or a file): where it was found, or where Ray looks for it."""
    env = os.environ if environ is None else environ
    if env.get(TOKEN, "").strip():
        return True, TOKEN
    if env.get(TOKEN_PATH):
        path = Path(env[TOKEN_PATH]).expanduser()
        return _holds(path), f"{path}, named by {TOKEN_PATH}"
    path = (Path.home() if home is None else home) / ".ray" / "auth_token"
    return _holds(path), str(path)


def _holds(path: Path) -> bool:
    try:
        return bool(path.read_text().strip())
    except (OSError, UnicodeDecodeError):
        return False


def join_advice(environ: Mapping[str, str] | None = None, home: Path | None = None) -> str:
    """What to check or set on this machine, as far as token authentication goes, when joining
    a cluster failed: a clause that follows ``"...; "``. The missing setting is named: a
    token held without ``RAY_AUTH_MODE=token`` (set it), or ``RAY_AUTH_MODE=token`` without a
    token (where it goes)."""
    env = os.environ if environ is None else environ
    held, where = token_place(env, home)
    mode = env.get(MODE, "")
    if mode.lower() != "token":
        said = f"{MODE}={mode}" if mode else f"{MODE} is not set"
        if held:
            return (
                f"this machine holds a Ray token ({where}), but {said} here, and a driver sends "
                f"its token only with {MODE}=token: set {MODE}=token to join a cluster with "
                "token authentication; else check --ray-address / RAY_ADDRESS and that "
                "`ray start --head` runs there"
            )
        return (
            "check --ray-address / RAY_ADDRESS and that `ray start --head` runs there; a "
            f"cluster with token authentication needs its token on this machine ({where}) and "
            f"{MODE}=token set here ({said})"
        )
    if held:
        return (
            "check --ray-address / RAY_ADDRESS, that `ray start --head` runs there, and that "
            f"the token this machine holds ({where}) is the cluster's"
        )
    return (
        f"{MODE}=token is set here, but this machine holds no Ray token: copy the cluster's "
        f"token to {where} (or give it in {TOKEN})"
    )
