"""Real nats-server processes in temp dirs: lifecycle, concurrency, staleness, crash durability."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.js.api import StorageType

from ftrain.events.jetstream.nats_server import (
    NatsServerError,
    ServerProcess,
    ensure_server,
    server_status,
    start_server,
    stop_server,
    throwaway_server,
)
from ftrain.events.jetstream.server_files import SERVER_NAME, user_key
from tests.support.servers import kill_server, plain_connect, restart_server


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """A ftrain home whose server (if any) is always stopped afterwards."""
    try:
        yield tmp_path
    finally:
        stop_server(tmp_path, timeout=5.0)


def _dead_pid() -> int:
    """A pid that certainly belonged to a process that has exited (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_start_status_reuse_stop(home: Path) -> None:
    first = ensure_server(home)
    assert first.url == f"nats://127.0.0.1:{first.port}"
    assert Path(first.store_dir) == (home / "nats" / "store").absolute()
    assert server_status(home) == first
    again = ensure_server(home)
    assert (again.pid, again.port, again.url) == (first.pid, first.port, first.url)
    assert stop_server(home) is True
    assert server_status(home) is None
    assert not (home / "nats" / "server.json").exists()
    assert stop_server(home) is False


def test_url_is_stable_across_a_clean_stop(home: Path) -> None:
    first = ensure_server(home)
    stop_server(home)
    second = ensure_server(home)
    assert second.url == first.url
    assert second.pid != first.pid


def listening(pid: int) -> set[tuple[str, int]]:
    """The TCP (address, port) pairs process `pid` listens on, as the kernel reports them."""
    sockets = {os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()}
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            local, state, inode = (line.split()[i] for i in (1, 3, 9))
            if state == "0A" and f"socket:[{inode}]" in sockets:  # 0A: LISTEN
                address, port = local.split(":")
                ipv4 = socket.inet_ntoa(bytes.fromhex(address)[::-1]) if len(address) == 8 else address
                found.add((ipv4, int(port, 16)))
    return found


def test_the_running_server_is_local_unmonitored_and_fsynced(home: Path) -> None:
    server = ensure_server(home)
    # its only listening socket is the client port on loopback: no HTTP monitoring, cluster, gateway or
    # leaf node port (and so no monitoring endpoint to ask the rest)
    assert listening(server.pid) == {("127.0.0.1", server.port)}
    # the rest from the server itself: it logs a digest of the configuration it parsed and runs (Go's JSON
    # encoding of the parsed map, nats-server 2.15), which must be exactly this one: every write synced
    nats_dir = home / "nats"
    running = {
        "authorization": {"users": [{"nkey": user_key(nats_dir)}]},  # only the public key: no secret in it
        "jetstream": {"store_dir": server.store_dir, "sync_interval": "always"},
        "listen": f"127.0.0.1:{server.port}",
        "max_payload": 1048576,
        "pid_file": str(nats_dir / "server.pid"),
        "server_name": SERVER_NAME,
    }
    encoded = json.dumps(running, sort_keys=True, separators=(",", ":")) + "\n"
    digest = hashlib.sha256(encoded.encode()).hexdigest()
    loaded = f"Using configuration file: {nats_dir / 'server.conf'} (sha256:{digest})"
    assert loaded in (nats_dir / "server.log").read_text()


def test_start_server_refuses_a_second_server_on_the_same_store(home: Path) -> None:
    ensure_server(home)
    with pytest.raises(NatsServerError, match="already runs"):
        start_server(home)


def test_concurrent_ensure_from_processes_starts_one_server(home: Path) -> None:
    code = (
        "import sys, msgspec; from pathlib import Path; from ftrain.events.jetstream.nats_server import ensure_server; "
        "sys.stdout.buffer.write(msgspec.json.encode(ensure_server(Path(sys.argv[1]))))"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(home)], stdout=subprocess.PIPE) for _ in range(3)
    ]
    # last line: structlog's default logger also prints to stdout
    outs = [json.loads(p.communicate(timeout=30)[0].splitlines()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len({(o["pid"], o["url"]) for o in outs}) == 1
    status = server_status(home)
    assert status is not None
    assert status.pid == outs[0]["pid"]


def test_concurrent_ensure_from_threads_starts_one_server(home: Path) -> None:
    results: list[ServerProcess] = []
    barrier = threading.Barrier(4)

    def call() -> None:
        barrier.wait()
        results.append(ensure_server(home))

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 4
    assert len({(r.pid, r.url) for r in results}) == 1


def test_stale_record_starts_a_new_server(home: Path) -> None:
    nats_dir = home / "nats"
    nats_dir.mkdir()
    stale = ServerProcess(
        pid=_dead_pid(), port=1, url="nats://127.0.0.1:1", store_dir=str(nats_dir / "store"), started_at=0.0
    )
    (nats_dir / "server.json").write_text(json.dumps({f: getattr(stale, f) for f in stale.__struct_fields__}))
    assert server_status(home) is None
    fresh = ensure_server(home)
    assert fresh.pid != stale.pid
    assert server_status(home) == fresh


def test_record_pointing_at_a_non_nats_process_is_stale(home: Path) -> None:
    nats_dir = home / "nats"
    nats_dir.mkdir()
    rec = {"pid": os.getpid(), "port": 1, "url": "x", "store_dir": "x", "started_at": 0.0}
    (nats_dir / "server.json").write_text(json.dumps(rec))
    assert server_status(home) is None
    assert ensure_server(home).pid != os.getpid()


async def test_kill_9_then_ensure_keeps_every_acked_message(home: Path) -> None:
    first = ensure_server(home)
    nc = await plain_connect(first.url, first.nkey_file)
    js = nc.jetstream()
    await js.add_stream(name="CRASH", subjects=["crash.>"], storage=StorageType.FILE)
    for i in range(200):
        ack = await js.publish("crash.evt", str(i).encode())
        assert ack.seq == i + 1
    await nc.close()

    kill_server(first)
    assert server_status(home) is None
    second = ensure_server(home)
    assert second.pid != first.pid
    assert (second.store_dir, second.port) == (first.store_dir, first.port)

    nc = await plain_connect(second.url, second.nkey_file)
    try:
        info = await nc.jetstream().stream_info("CRASH")
        assert info.state.messages == 200
        assert info.state.last_seq == 200
    finally:
        await nc.close()


def test_throwaway_server_and_restart_are_cleaned_up(tmp_path: Path) -> None:
    with throwaway_server(tmp_path) as first:
        assert server_status(tmp_path) == first
        second = restart_server(first)
        assert (second.port, second.store_dir) == (first.port, first.store_dir)
        assert second.pid != first.pid
    assert server_status(tmp_path) is None
    for pid in (first.pid, second.pid):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_explicit_port_in_use_raises_with_log_tail(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(NatsServerError, match="address already in use"):
            start_server(tmp_path, port=port)
    assert server_status(tmp_path) is None


def test_stop_escalates_to_sigkill_when_sigterm_is_ignored(home: Path) -> None:
    proc = ensure_server(home)
    os.kill(proc.pid, signal.SIGSTOP)  # a stopped process cannot act on SIGTERM
    assert stop_server(home, timeout=0.3) is True
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)
