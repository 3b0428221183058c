"""--ray-address checked before Ray is handed it and before anything is made: a bad form,
nobody there, or something there that is no Ray cluster is bad usage (exit 2, no run
directory), said in one line; nothing waits for minutes."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest

from tests.conftest import cli_here

pytest.importorskip("ray")


@pytest.fixture
def http_port():
    """An HTTP/1 server on a free port of this machine, in a thread of this process."""
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(capsys, tmp_path, address: str) -> tuple[int, str, float]:
    start = time.monotonic()
    code, err = cli_here(
        capsys, "run", "--plugin", "impala", "--backend", "ray", "--ray-address", address,
        "--run-dir", str(tmp_path / "run"), "--quiet",
    )  # fmt: skip
    assert not (tmp_path / "run").exists()  # refused before anything is made
    return code, err, time.monotonic() - start


@pytest.mark.parametrize("address", ["localhost:-5", "localhost:0", "localhost:70000", "nohost"])
def test_an_address_that_is_no_host_and_port_is_refused(capsys, tmp_path, address):
    code, err, _ = _run(capsys, tmp_path, address)
    assert code == 2
    assert f"--ray-address {address!r}: expected HOST:PORT (port 1-65535)" in err


def test_an_address_with_nobody_there_is_refused_at_once(capsys, tmp_path):
    code, err, took = _run(capsys, tmp_path, f"127.0.0.1:{_free_port()}")
    assert code == 2 and "nothing answers there" in err and took < 30


def test_brackets_of_an_ipv6_address_do_not_reach_the_resolver(capsys, tmp_path):
    code, err, _ = _run(capsys, tmp_path, f"[::1]:{_free_port()}")
    assert code == 2 and "nothing answers there" in err
    assert "Name or service not known" not in err and "expected HOST:PORT" not in err


def test_a_port_where_something_else_answers_is_refused_as_no_ray_cluster(
    capsys, tmp_path, http_port
):
    code, err, took = _run(capsys, tmp_path, f"127.0.0.1:{http_port}")
    assert code == 2 and took < 30
    assert "something answers there, but not a Ray cluster" in err


def test_a_ray_run_on_this_machine_that_cannot_fit_its_memory_is_refused(capsys, tmp_path):
    """Ray started here puts every actor on this machine: the local backend's memory check
    applies, before Ray is started."""
    code, err = cli_here(
        capsys, "run", "--plugin", "impala", "--backend", "ray", "--workers", "400",
        "--run-dir", str(tmp_path / "run"), "--quiet",
    )  # fmt: skip
    assert code == 2 and "the run would start 404 processes of about 160 MiB each" in err
    assert not (tmp_path / "run").exists()


def test_shared_state_counts_against_memory_too():
    from mprl.backends.processes import CHILD_BYTES, check_memory
    from mprl.errors import UsageError

    with pytest.raises(UsageError, match=r"shared state .* takes about 4,000 MiB.*buffer_size"):
        check_memory(2, shared_bytes=4000 * 2**20, available=3 * 2**30)
    assert check_memory(2, shared_bytes=0, available=1000 * CHILD_BYTES) == []
