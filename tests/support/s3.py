"""S3 endpoints for tests: a throwaway SeaweedFS (`weed server`) and a moto server, each on free ports, and a
fresh bucket per test. The backend suite runs the same tests against both."""

import contextlib
import functools
import logging
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from ftrain.workers.s3.seaweed_server import (
    SeaweedProcess,
    ensure_storage_server,
    kill_storage_server,
    throwaway_storage_server,
)
from ftrain.workers.storage.location import Location
from ftrain.workers.storage.one_rank import write_step
from ftrain.workers.storage.port import StoredCheckpoint
from ftrain.workers.storage.s3.boto_client import make_client
from ftrain.workers.storage.s3.run_prefix import S3Run

S3_KINDS = {"seaweedfs": "weed", "moto": "moto"}
"""The S3 implementations the portability suites run on, each with its session fixture's name
(tests/conftest.py)."""


class Endpoint(msgspec.Struct, frozen=True):
    """An S3 endpoint a test talks to, with the keys it admits."""

    kind: str
    url: str
    access_key: str
    secret_key: str
    checks_credentials: bool

    def env(self) -> dict[str, str]:
        """The standard AWS variables that point a process at it."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def client(self, *, secret_key: str | None = None, timeout: float = 5.0) -> Any:
        """A boto3 client configured as ftrain's, made once per endpoint, settings and `AWS_*` variables as
        they now stand (a client costs 0.13-0.3 s to make; one is thread-safe)."""
        chain = tuple(sorted((name, value) for name, value in os.environ.items() if name.startswith("AWS_")))
        return _client(self.url, self.access_key, secret_key or self.secret_key, timeout, chain)

    def new_bucket(self) -> str:
        """A fresh bucket for one test."""
        name = f"t-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def run(self, bucket: str, run_id: str, prefix: str = "ckpt", **kwargs: Any) -> S3Run:
        """ftrain's S3 backend for run `run_id` under `s3://bucket/prefix` (kwargs: the client's)."""
        return S3Run(Location("s3", f"s3://{bucket}/{prefix}", run_id), client=self.client(**kwargs))


def write_whole(run: S3Run, **step: Any) -> StoredCheckpoint:
    """A step of `run`, written as `ftrain checkpoint` writes it (the port's one-rank writer)."""
    return write_step(run, run_id=run.run, **step)


@functools.cache
def _client(
    url: str, access_key: str, secret_key: str, timeout: float, chain: tuple[tuple[str, str], ...]
) -> Any:
    """`chain` only keys the cache: the client reads the AWS chain from the environment itself."""
    return make_client(
        endpoint=url, access_key=access_key, secret_key=secret_key, timeout=timeout, attempts=2
    )


@contextlib.contextmanager
def seaweedfs(tmp: Path) -> Iterator[Endpoint]:
    """A throwaway SeaweedFS under `tmp`, killed on exit."""
    with throwaway_storage_server(tmp) as proc:
        yield Endpoint("seaweedfs", proc.endpoint, proc.access_key, proc.secret_key, True)


def restart_seaweedfs(proc: SeaweedProcess, probe: tuple[str, str] | None = None) -> SeaweedProcess:
    """SIGKILL the server (if still alive), then start it again on the same data directory, keys and ports.
    Its S3 gateway answers listings a second or two before objects written before the crash can be read
    (InternalError until the volume server has re-registered): with `probe` (bucket, key of an object
    written before), wait until that object reads back."""
    kill_storage_server(proc)
    home = Path(proc.data_dir).parent.parent  # data_dir is <home>/seaweedfs/data
    new = ensure_storage_server(home, bucket=None, ports=proc.ports)
    if (new.endpoint, new.data_dir) != (proc.endpoint, proc.data_dir):
        raise AssertionError(f"restarted at {new.endpoint} on {new.data_dir}, expected {proc.endpoint}")
    if probe is not None:
        client = make_client(
            endpoint=new.endpoint, access_key=new.access_key, secret_key=new.secret_key, timeout=2, attempts=1
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                client.get_object(Bucket=probe[0], Key=probe[1])["Body"].read()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    return new


@contextlib.contextmanager
def moto_server() -> Iterator[Endpoint]:
    """A moto server in a thread of this process on a free port (it admits any keys)."""
    from moto.server import ThreadedMotoServer

    from tests.support.processes import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server.start()
    try:
        yield Endpoint("moto", f"http://127.0.0.1:{port}", "testing", "testing", False)
    finally:
        server.stop()


@contextlib.contextmanager
def endpoint(kind: str, tmp: Path) -> Iterator[Endpoint]:
    """One endpoint of `kind` ('seaweedfs' or 'moto')."""
    with seaweedfs(tmp) if kind == "seaweedfs" else moto_server() as found:
        yield found
