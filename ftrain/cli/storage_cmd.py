"""`ftrain storage start|stop|status`: the embedded SeaweedFS (S3-compatible) server under $FTRAIN_HOME, for
development and tests. Clients reach it through the standard AWS chain: `start` and `status` print the three
variables that select its profile (the key itself stays in 0600 files)."""

from collections.abc import Mapping

from ftrain import settings
from ftrain.cli.render import emit
from ftrain.errors import Refused
from ftrain.workers.s3.server import (
    DEFAULT_BUCKET,
    SeaweedError,
    SeaweedProcess,
    ensure_storage_server,
    stop_storage_server,
    storage_server_status,
)


def storage_command(action: str, env: Mapping[str, str]) -> int:
    """Run one action; `status` exits 3 when no server runs."""
    home = settings.home(env)
    try:
        if action == "start":
            _describe(ensure_storage_server(home))
        elif action == "stop":
            emit("SeaweedFS stopped" if stop_storage_server(home) else "SeaweedFS was not running")
        else:
            running = storage_server_status(home)
            if running is None:
                emit(f"SeaweedFS not running (home {home})")
                return 3
            _describe(running)
    except SeaweedError as exc:
        raise Refused(str(exc)) from exc
    return 0


def _describe(proc: SeaweedProcess) -> None:
    emit(
        f"SeaweedFS S3 running at {proc.endpoint} (pid {proc.pid}, data {proc.data_dir}), bucket {DEFAULT_BUCKET}"
    )
    emit(
        " ".join(f"export {k}={v};" for k, v in proc.env().items())
        + f" export FTRAIN_STORAGE=s3://{DEFAULT_BUCKET}/checkpoints"
    )
