"""The embedded broker admits only clients holding its user nkey: other local users, and keyless clients, are
refused; an older ftrain's open server is not reused; the key and everything beside it are private."""

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftrain.events.jetstream.nats_server import (
    ServerProcess,
    ensure_server,
    nats_server_binary,
    stop_server,
    throwaway_server,
)
from ftrain.events.jetstream.server_procs import js_ready
from tests.support.processes import free_port
from tests.support.servers import plain_connect

# A keyless client, stdlib only so it runs as another uid: connect, publish, ping; print the server's answer,
# then whether the seed file can be read.
PROBE = """
import socket, sys
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5) as s:
    f = s.makefile("rb")
    f.readline()  # INFO
    s.sendall(b'CONNECT {"verbose":false,"pedantic":false}\\r\\nPUB ftrain.run.x.launched 1\\r\\nx\\r\\nPING\\r\\n')
    print(f.readline().decode().strip())
try:
    open(sys.argv[2], "rb").read()
    print("seed readable")
except OSError as exc:
    print(type(exc).__name__)
"""
REFUSED = "-ERR 'Authorization Violation'"
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def keyless(port: int, seed: str, *, as_nobody: bool = False) -> list[str]:
    """What a client without the key gets from the server at `port`, and whether it can read `seed`."""
    python = ["/usr/bin/python3", "-I"] if as_nobody else [sys.executable, "-I"]
    argv = [*(NOBODY if as_nobody else []), *python, "-c", PROBE, str(port), seed]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    try:
        yield tmp_path / "home"
    finally:
        stop_server(tmp_path / "home")


def test_a_client_without_the_key_is_refused_as_root_and_as_another_user(home: Path) -> None:
    server = ensure_server(home)
    assert keyless(server.port, server.nkey_file) == [REFUSED, "seed readable"]  # root reads any file
    if shutil.which("setpriv") is None or not Path("/usr/bin/python3").exists():
        pytest.skip("needs setpriv and a system python3 to act as another user")
    assert keyless(server.port, server.nkey_file, as_nobody=True) == [REFUSED, "PermissionError"]


async def test_a_client_with_the_key_publishes_and_reads_back(tmp_path: Path) -> None:
    with throwaway_server(tmp_path) as server:
        assert keyless(server.port, server.nkey_file)[0] == REFUSED  # the tests' server requires it too
        nc = await plain_connect(server.url, server.nkey_file)
        try:
            js = nc.jetstream()
            await js.add_stream(name="AUTH", subjects=["auth.>"])
            assert (await js.publish("auth.x", b"signed in")).seq == 1
            assert (await js.get_last_msg("AUTH", "auth.x")).data == b"signed in"
        finally:
            await nc.close()


def test_an_older_open_server_is_replaced_not_reused(home: Path) -> None:
    directory, port = home / "nats", free_port()
    directory.mkdir(parents=True)
    conf = directory / "server.conf"  # what an older ftrain wrote: no authorization block
    conf.write_text(
        f'server_name: "ftrain-embedded"\nlisten: "127.0.0.1:{port}"\npid_file: "{directory / "server.pid"}"\n'
        f'jetstream {{\n  store_dir: "{directory / "store"}"\n}}\n'
    )
    old = subprocess.Popen(
        [str(nats_server_binary()), "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        while not js_ready(port, timeout=0.25):
            assert old.poll() is None
        record = {
            "pid": old.pid,
            "port": port,
            "url": f"nats://127.0.0.1:{port}",
            "store_dir": "",
            "started_at": 0.0,
        }
        (directory / "server.json").write_text(json.dumps(record))
        assert keyless(port, "/nonexistent")[0] == "PONG"  # open to anyone on the machine

        new = ensure_server(home)
        assert old.wait(timeout=10) is not None  # stopped, not left running beside the new one
        assert new.pid != old.pid and new.nkey_file == str(directory / "user.nk")
        assert keyless(new.port, new.nkey_file)[0] == REFUSED
        assert ensure_server(home).pid == new.pid  # and the authenticated one is reused from then on
    finally:
        if old.poll() is None:
            old.kill()
            old.wait()


def test_the_key_the_config_and_the_store_are_private_whatever_the_umask(home: Path) -> None:
    home.mkdir(mode=0o755)  # an FTRAIN_HOME an older version left readable (one left writable is refused)
    previous = os.umask(0)
    try:
        server = ensure_server(home)
    finally:
        os.umask(previous)
    directory = home / "nats"
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in [home, directory, *directory.iterdir()]}
    assert modes == {
        "home": 0o700,
        "nats": 0o700,
        "store": 0o700,
        "server.conf": 0o600,
        "server.json": 0o600,
        "server.log": 0o600,
        "server.pid": 0o600,
        "lock": 0o600,
        "user.nk": 0o600,
    }
    seed = Path(server.nkey_file).read_text()
    assert seed.startswith("SU") and seed.strip() not in (directory / "server.conf").read_text()
    assert 'authorization { users = [ { nkey: "U' in (directory / "server.conf").read_text()
    assert seed == Path(ensure_server(home).nkey_file).read_text()  # kept: holders of the file stay signed in


def test_the_key_and_port_survive_a_restart(home: Path) -> None:
    first: ServerProcess = ensure_server(home)
    stop_server(home)
    second = ensure_server(home)
    assert (second.port, second.nkey_file) == (first.port, first.nkey_file)
