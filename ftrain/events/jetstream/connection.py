"""Where the log lives: the embedded nats-server by default, or the server or cluster the settings name."""

import asyncio
import hashlib
import ssl
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import nats.errors
import structlog

from ftrain.events.anchor_file import AnchorFiles
from ftrain.events.jetstream.nats_client import Nats
from ftrain.events.jetstream.store import EventStore
from ftrain.events.keyring import load_signer, load_trust
from ftrain.events.log_port import LogUnavailable
from ftrain.events.redact import redact_text, redact_urls
from ftrain.events.schema import Actor
from ftrain.events.signed_log import process_actor
from ftrain.events.signing import Signer, TrustList

log = structlog.get_logger(__name__)
PING_SECONDS = 2
"""How often the client pings its server. A server that vanished without closing the connection (its node lost,
or cut off) is noticed after three unanswered intervals and another server of the cluster takes over; nats-py's
default, 2 minutes, would hold every append to the dead one until its deadline."""


class NatsSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How to reach the log; the application builds it from its environment (`ftrain.settings`). No `url`: the
    embedded server under `home`, signed in to with its own nkey. `nkey`: the path of an nkey seed file for a
    server of the user's own."""

    home: Path
    url: str | None = None
    user: str | None = None
    password: str | None = None
    token: str | None = None
    creds: str | None = None
    nkey: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    replicas: int = 1
    trusted_keys: tuple[tuple[str, str], ...] = ()
    """(public key hex, name) pairs trusted beyond `<home>/keys/trusted`."""
    accept_unsigned: bool = False
    """Act on runs whose events carry no signature (logs from before signing); never the default."""
    anchor_mirror: Path | None = None
    """A second directory that receives every anchor note (another file system than `home`'s)."""


def endpoint_name(settings: NatsSettings, stem: str, suffix: str) -> str:
    """A per-log file name under home (`<stem><suffix>` for the embedded server, `<stem>-<12 hex of the
    URL><suffix>` for one set by URL): one home can talk to several logs without mixing their state."""
    if settings.url is None:
        return f"{stem}{suffix}"
    return f"{stem}-{hashlib.sha256(settings.url.encode()).hexdigest()[:12]}{suffix}"


def anchor_files(settings: NatsSettings) -> list[Path]:
    """Where this log's anchors go: under home, and in the mirror directory when one is set."""
    name = endpoint_name(settings, "anchors", ".log")
    return [settings.home / name, *([settings.anchor_mirror / name] if settings.anchor_mirror else [])]


class LogWriter(NamedTuple):
    """Who this process writes the log as: the actor its events name, the key that signs them, whose
    signatures its readers act on, and where it anchors heads."""

    actor: Actor
    signer: Signer
    trust: TrustList
    anchors: AnchorFiles


@contextmanager
def log_writer(settings: NatsSettings, rank: int | None = None) -> Iterator[LogWriter]:
    """This user's writer of the log the settings name (its key made on first use), the anchor files held
    open until the end; `rank` when a trainer's rank appends."""
    actor = process_actor(rank)
    signer = load_signer(settings.home, f"{actor.user}@{actor.host}")
    trust = load_trust(settings.home, settings.trusted_keys, accept_unsigned=settings.accept_unsigned)
    anchors = AnchorFiles(anchor_files(settings), signer, trust)
    try:
        yield LogWriter(actor, signer, trust, anchors)
    finally:
        anchors.close()


def server_endpoint(settings: NatsSettings) -> tuple[list[str], dict[str, Any]]:
    """The servers to connect to and the client's sign-in options; starts (or reuses) the embedded server,
    and signs in with its key, when no URL is configured."""
    if settings.url is not None:
        return [u.strip() for u in settings.url.split(",") if u.strip()], _connect_options(settings)
    from ftrain.events.jetstream.nats_server import ensure_server

    embedded = ensure_server(settings.home)
    return [embedded.url], {"nkeys_seed": embedded.nkey_file}


def _connect_options(settings: NatsSettings) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if settings.nkey:
        options["nkeys_seed"] = settings.nkey
    if settings.user:
        options["user"], options["password"] = settings.user, settings.password or ""
    if settings.token:
        options["token"] = settings.token
    if settings.creds:
        options["user_credentials"] = settings.creds
    if settings.tls_ca or settings.tls_cert:
        context = ssl.create_default_context(cafile=settings.tls_ca)
        if settings.tls_cert:
            context.load_cert_chain(settings.tls_cert, settings.tls_key)
        options["tls"] = context
    return options


class PermissionDenied(nats.errors.Error):
    """The server refused a publish the credential may not make: a read-only key appending, or changing the
    stream. Not retried: asking again cannot help."""


PERMISSION_DENIED = "permissions violation for publish"
"""How nats-py hands on the server's `-ERR 'Permissions Violation for Publish to …'` (lower-cased)."""


def _refusal(errors: list[Exception]) -> str | None:
    """A definitive refusal among the client's errors (bad credentials, an untrusted certificate), if any:
    retrying cannot help, and it says more than the connection reset that follows it."""
    definitive = (nats.errors.AuthorizationError, ssl.SSLCertVerificationError)
    refused = (e for e in errors if isinstance(e, definitive) or "Authorization Violation" in str(e))
    return next((str(e) for e in refused), None)


@asynccontextmanager
async def open_store(
    settings: NatsSettings,
    *,
    connect_timeout: int = 2,
    connect_deadline: float = 5.0,
    deadline: float = 30.0,
    rank: int | None = None,
) -> AsyncIterator[EventStore]:
    """A connected EventStore whose stream exists; raises LogUnavailable when no server answers. Its events
    name this process as their actor, with `rank` when a trainer's rank appends them."""
    urls, options = server_endpoint(settings)
    secrets = (settings.password, settings.token)
    errors: list[Exception] = []
    refused = asyncio.Event()

    async def remember(exc: Exception) -> None:
        """Keep the client's errors for the message (without an error callback nats-py prints a traceback
        per reconnect attempt); a refusal (bad credentials) ends the attempt at once, and a refused publish
        ends the request waiting on it (the server never answers it)."""
        errors.append(exc)
        log.debug("nats_error", error=redact_text(f"{type(exc).__name__}: {exc}", secrets))
        if _refusal([exc]):
            refused.set()
        if PERMISSION_DENIED in str(exc):
            said = str(exc).removeprefix("nats: ")
            nc.fail_requests(
                PermissionDenied(f"refused by the server: {said} (this key may not change the log)")
            )

    nc = Nats()
    connecting = asyncio.ensure_future(
        nc.connect(
            servers=urls,
            connect_timeout=connect_timeout,
            max_reconnect_attempts=-1,
            reconnect_time_wait=1,
            allow_reconnect=True,
            ping_interval=PING_SECONDS,
            max_outstanding_pings=2,
            error_cb=remember,
            **options,
        )
    )
    watching = asyncio.ensure_future(refused.wait())
    await asyncio.wait({connecting, watching}, timeout=connect_deadline, return_when=asyncio.FIRST_COMPLETED)
    watching.cancel()
    failure = connecting.exception() if connecting.done() and not connecting.cancelled() else None
    if not connecting.done() or failure is not None:
        connecting.cancel()
        await asyncio.gather(connecting, return_exceptions=True)
        with suppress(Exception):
            await nc.close()
        reason = (
            _refusal(errors)
            or (str(failure) if failure else "")
            or (str(errors[-1]) if errors else f"no answer within {connect_deadline:g} s")
        )
        shown = redact_text(reason, secrets)
        raise LogUnavailable(f"event log unreachable at {redact_urls(urls)}: {shown}") from failure
    try:
        with log_writer(settings, rank) as writer:
            yield EventStore(nc, replicas=settings.replicas, deadline=deadline, **writer._asdict())
    finally:
        try:
            await nc.close()
        except (OSError, nats.errors.Error) as exc:  # the broker died: never mask the error that says so
            log.debug("nats_close_failed", error=f"{type(exc).__name__}: {exc}")
