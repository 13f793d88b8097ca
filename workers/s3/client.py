"""The boto3 S3 client ftrain uses, and how its errors read.

Endpoint, region and credentials come from the standard AWS chain only (`AWS_ENDPOINT_URL`, `AWS_PROFILE`,
`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, `~/.aws/config` and `credentials`, instance roles): nothing of
ftrain's own. Checksums are sent and checked only where the operation requires them (`when_required`): boto3 ≥
1.36 otherwise sends CRC checksums some S3-compatible stores reject; ftrain hashes every byte itself. Timeouts
and retries are bounded, so an unreachable endpoint is reported within seconds, never waited on.
"""

import os
import threading
from typing import Any, Final

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

CONNECT_TIMEOUT: Final = 5.0
READ_TIMEOUT: Final = 30.0
ATTEMPTS: Final = 3

MISSING: Final = frozenset({"NoSuchKey", "404", "NotFound"})
"""Codes of an object that is not there (in a bucket that is)."""
PRECONDITION_FAILED: Final = frozenset({"PreconditionFailed", "412"})
"""A conditional write lost: the object exists."""
CONFLICT: Final = frozenset({"ConditionalRequestConflict", "OperationAborted", "409"})
"""A conditional write raced another one in flight: retry it."""


def client_config(timeout: float = READ_TIMEOUT, attempts: int = ATTEMPTS) -> Config:
    """Bounded timeouts and retries; checksums only when required."""
    return Config(
        connect_timeout=min(CONNECT_TIMEOUT, timeout),
        read_timeout=timeout,
        retries={"max_attempts": attempts, "mode": "standard"},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )


def make_client(
    *,
    endpoint: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
    timeout: float = READ_TIMEOUT,
    attempts: int = ATTEMPTS,
) -> Any:
    """An S3 client: from the standard AWS chain, or (the embedded server's own probes) explicit values."""
    session = boto3.session.Session(
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name="us-east-1" if access_key else None,
    )
    return session.client("s3", endpoint_url=endpoint, config=client_config(timeout, attempts))


_shared: dict[tuple[tuple[str, str], ...], Any] = {}
_shared_lock = threading.Lock()


def shared_client() -> Any:
    """The process's client for the standard AWS chain as the `AWS_*` variables now stand: made once per such
    configuration (making one costs 0.13-0.3 s here; a client is thread-safe), so a trainer's resume and its
    saves share one."""
    key = tuple(sorted((name, value) for name, value in os.environ.items() if name.startswith("AWS_")))
    with _shared_lock:
        if key not in _shared:
            _shared[key] = make_client()
        return _shared[key]


def error_code(exc: BaseException) -> str:
    """The S3 error code of a ClientError (`NoSuchBucket`, `AccessDenied`, `412`…), else ''."""
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def reason(exc: BaseException) -> str:
    """The server's reason, one line: `NoSuchBucket: The specified bucket does not exist`, or the transport's."""
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", "")) or str(
            exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "")
        )
        message = str(err.get("Message", "")).strip()
        return f"{code}: {message}" if message and message != code else code or str(exc)
    if isinstance(exc, BotoCoreError):
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"{type(exc).__name__}: {exc}"


def is_missing(exc: BaseException) -> bool:
    """The object is not there (its bucket answered)."""
    return error_code(exc) in MISSING
