"""The boto3 S3 client ftrain uses, and how its errors read.

Endpoint, region, credentials, retries and checksums come from the standard AWS chain only
(`AWS_ENDPOINT_URL`, `AWS_PROFILE`, `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, `AWS_MAX_ATTEMPTS`,
`AWS_REQUEST_CHECKSUM_CALCULATION`, `~/.aws/config` and `credentials`, instance roles): nothing of ftrain's own.
Where the chain is silent, ftrain bounds the timeouts and retries (an unreachable endpoint is reported within
seconds, never waited on) and keeps boto3's default checksums on the wire (CRC32 on every upload, checked by
the store; both stores tested here keep them). A store that rejects them (boto3 ≥ 1.36 sends them by default;
some S3-compatible stores refuse the headers) is named in the error with the standard switch that turns them
off: `AWS_REQUEST_CHECKSUM_CALCULATION=when_required`. ftrain's own SHA-256 of every byte stands either way.
"""

import os
import threading
from typing import Any, Final

import boto3
import botocore.session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

CONNECT_TIMEOUT: Final = 5.0
READ_TIMEOUT: Final = 30.0
ATTEMPTS: Final = 3

MISSING: Final = frozenset({"NoSuchKey", "404", "NotFound"})
"""Codes of an object that is not there (in a bucket that is)."""
PRECONDITION_FAILED: Final = frozenset({"PreconditionFailed", "412"})
"""A conditional write lost: the object exists."""
CHECKSUM_REFUSED: Final = frozenset({"XAmzContentSHA256Mismatch", "NotImplemented", "MissingContentLength"})
"""Codes some S3-compatible stores answer to boto3's default checksum headers (a store that understands them
and finds the bytes damaged answers BadDigest instead: an upload to retry, not a setting to change)."""
CHECKSUM_HINT: Final = (
    " (if this store does not accept boto3's checksum headers, set AWS_REQUEST_CHECKSUM_CALCULATION="
    "when_required and AWS_RESPONSE_CHECKSUM_VALIDATION=when_required)"
)
CONFLICT: Final = frozenset({"ConditionalRequestConflict", "OperationAborted", "409"})
"""A conditional write raced another one in flight: retry it."""


def client_config(session: Any, timeout: float = READ_TIMEOUT, attempts: int = ATTEMPTS) -> Config:
    """Bounded timeouts; retries bounded unless the AWS chain sets them; checksums as the chain says."""
    retries: Any = {"mode": session.get_config_variable("retry_mode") or "standard"}
    if session.get_config_variable("max_attempts") is None:
        retries["max_attempts"] = attempts
    return Config(connect_timeout=min(CONNECT_TIMEOUT, timeout), read_timeout=timeout, retries=retries)


def make_client(
    *,
    endpoint: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
    timeout: float = READ_TIMEOUT,
    attempts: int = ATTEMPTS,
) -> Any:
    """An S3 client: from the standard AWS chain, or (the embedded server's own probes) explicit values."""
    chain = botocore.session.Session()
    session = boto3.session.Session(
        botocore_session=chain,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name="us-east-1" if access_key else None,
    )
    return session.client("s3", endpoint_url=endpoint, config=client_config(chain, timeout, attempts))


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


CREDENTIAL_CODES: Final = frozenset(
    {"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"}
)
"""What an S3 store answers a request signed with credentials it does not accept."""


def credentials_refused(exc: BaseException) -> bool:
    """Whether `exc` says the credentials are missing, incomplete, or not accepted by the store."""
    return (
        isinstance(exc, NoCredentialsError | PartialCredentialsError) or error_code(exc) in CREDENTIAL_CODES
    )


def reason(exc: BaseException) -> str:
    """The server's reason, one line: `NoSuchBucket: The specified bucket does not exist`, or the transport's;
    a refusal that may be of the checksum headers says how to turn them off."""
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", "")) or str(
            exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "")
        )
        message = str(err.get("Message", "")).strip()
        line = f"{code}: {message}" if message and message != code else code or str(exc)
        if code in CHECKSUM_REFUSED or (code == "InvalidArgument" and "checksum" in message.lower()):
            line += CHECKSUM_HINT
        return line
    if isinstance(exc, BotoCoreError):
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"{type(exc).__name__}: {exc}"


def is_missing(exc: BaseException) -> bool:
    """The object is not there (its bucket answered)."""
    return error_code(exc) in MISSING
