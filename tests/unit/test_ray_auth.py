"""A driver refused by a cluster with token authentication is told which setting it lacks: the
token is on this machine but ``RAY_AUTH_MODE=token`` is not set (Ray sends a token only then),
or the mode is set and no token is where Ray looks for one (``RAY_AUTH_TOKEN``, the file
``RAY_AUTH_TOKEN_PATH`` names, ``~/.ray/auth_token``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mprl_builtin.ray import auth


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def _token(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("8f6049866e2668143e981cd8a17a2b16\n")
    return path


def test_a_token_without_the_mode_says_to_set_it(home):
    held = _token(home / ".ray" / "auth_token")
    said = auth.join_advice({}, home)
    assert "set RAY_AUTH_MODE=token" in said and str(held) in said, said
    assert "RAY_AUTH_MODE is not set" in said
    said = auth.join_advice({"RAY_AUTH_MODE": "disabled"}, home)
    assert "RAY_AUTH_MODE=disabled here" in said and "set RAY_AUTH_MODE=token" in said, said


@pytest.mark.parametrize("where", ["RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"])
def test_a_token_in_rays_variables_counts_as_held(home, tmp_path, where):
    env = {"RAY_AUTH_TOKEN": "8f6049866e2668143e981cd8a17a2b16"}
    if where == "RAY_AUTH_TOKEN_PATH":
        env = {"RAY_AUTH_TOKEN_PATH": str(_token(tmp_path / "elsewhere" / "token"))}
    assert auth.token_place(env, home)[0]
    assert "set RAY_AUTH_MODE=token" in auth.join_advice(env, home)


def test_the_mode_without_a_token_says_where_it_goes(home, tmp_path):
    said = auth.join_advice({"RAY_AUTH_MODE": "token"}, home)
    assert "RAY_AUTH_MODE=token is set here, but this machine holds no Ray token" in said
    assert f"copy the cluster's token to {home / '.ray' / 'auth_token'}" in said, said
    # RAY_AUTH_TOKEN_PATH set: only that file is read (a token in ~/.ray does not count)
    _token(home / ".ray" / "auth_token")
    missing = tmp_path / "nowhere" / "token"
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(missing)}
    said = auth.join_advice(env, home)
    assert f"copy the cluster's token to {missing}, named by RAY_AUTH_TOKEN_PATH" in said, said


def test_the_mode_and_a_token_leave_the_address_and_the_token_itself_to_check(home):
    held = _token(home / ".ray" / "auth_token")
    said = auth.join_advice({"RAY_AUTH_MODE": "TOKEN"}, home)  # (Ray reads it in any case)
    assert "set RAY_AUTH_MODE" not in said and "--ray-address" in said
    assert f"the token this machine holds ({held}) is the cluster's" in said, said


def test_neither_says_both_for_a_cluster_with_token_authentication(home):
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("")  # an empty file holds no token
    said = auth.join_advice({}, home)
    assert said.startswith("check --ray-address / RAY_ADDRESS"), said
    assert "needs its token on this machine" in said and "RAY_AUTH_MODE=token set here" in said


def test_the_refusal_of_a_join_carries_the_advice(home, monkeypatch):
    from mprl_builtin.ray import cluster

    _token(home / ".ray" / "auth_token")
    monkeypatch.setenv("HOME", str(home))
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    said = cluster.unreachable(ConnectionError("Failed to connect"), "10.0.0.5:6379")
    assert said.startswith("cannot join the Ray cluster at 10.0.0.5:6379 (Failed to connect)")
    assert "set RAY_AUTH_MODE=token" in said, said
