"""Every FTRAIN_* environment variable, read and checked in this one module.

The layers below the application (events, projections, workers) never look at the environment: they are handed
values (a home directory, `NatsSettings`), so a test or a driver can point them anywhere. Each reader takes the
environment as an argument (default: this process's); unset and empty read alike, so an empty value switches a
default back on. A malformed value raises `InvalidSetting`, one line naming the variable: the CLI exits 2 on it.
"""

import logging
import math
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final
from urllib.parse import unquote, urlparse

from ftrain.events.redact import redact_urls
from ftrain.events.run_id import InvalidRunId, validate_run_id
from ftrain.events.signing import KEY_PREFIX, InvalidKey, parse_public_key

if TYPE_CHECKING:  # imported where used: the log's client (nats, asyncio) is not every command's to load
    from ftrain.events.jetstream.connection import NatsSettings

HOME: Final = "FTRAIN_HOME"
STORAGE: Final = "FTRAIN_STORAGE"
NATS_URL: Final = "FTRAIN_NATS_URL"
NATS_USER: Final = "FTRAIN_NATS_USER"
NATS_PASSWORD: Final = "FTRAIN_NATS_PASSWORD"
NATS_TOKEN: Final = "FTRAIN_NATS_TOKEN"
NATS_CREDS: Final = "FTRAIN_NATS_CREDS"
NATS_NKEY: Final = "FTRAIN_NATS_NKEY"
"""The path of an nkey seed file (`SU…`) to sign in to the FTRAIN_NATS_URL server with."""
NATS_TLS_CA: Final = "FTRAIN_NATS_TLS_CA"
NATS_TLS_CERT: Final = "FTRAIN_NATS_TLS_CERT"
NATS_TLS_KEY: Final = "FTRAIN_NATS_TLS_KEY"
STREAM_REPLICAS: Final = "FTRAIN_STREAM_REPLICAS"
TRUSTED_KEYS: Final = "FTRAIN_TRUSTED_KEYS"
"""Writers trusted beyond `<home>/keys/trusted`: `[name=]ed25519:<hex>[,…]`."""
ACCEPT_UNSIGNED: Final = "FTRAIN_ACCEPT_UNSIGNED"
"""`1`: act on runs none of whose events is signed (logs written before signing)."""
ANCHOR_MIRROR: Final = "FTRAIN_ANCHOR_MIRROR"
"""A directory (another file system) that receives a copy of every anchor note."""
LOG_LEVEL: Final = "FTRAIN_LOG_LEVEL"
KILL_AT: Final = "FTRAIN_KILL_AT"
STOP_AT: Final = "FTRAIN_STOP_AT"
KILL_ONCE: Final = "FTRAIN_KILL_ONCE"
STEP_DELAY: Final = "FTRAIN_STEP_DELAY"
"""Seconds every rank sleeps after each optimizer step (failure injection: a slower job to act on mid-run)."""
REPLICA_DELAY: Final = "FTRAIN_REPLICA_DELAY"
"""Seconds each rank that has it sleeps before each exchange of memory snapshot replicas with its buddy
(failure injection: a slow link to the peer node; set on one node's ranks alone)."""
RUN_ID: Final = "FTRAIN_RUN_ID"
"""Set by `ftrain run` for the trainer: the run it records into."""
CKPT_DIR: Final = "FTRAIN_CKPT_DIR"
"""Set by `ftrain run` for the trainer: the run's checkpoint directory."""
ATTEMPT: Final = "FTRAIN_ATTEMPT"
"""Set by `ftrain run` for the trainer: the attempt the supervisor opened, which its events must carry."""
ATTEMPT_NONCE: Final = "FTRAIN_ATTEMPT_NONCE"
"""Set by `ftrain run` for every process of an attempt: a random token no other attempt has, by which the
supervisor finds the attempt's processes when it ends it (run ids and attempt numbers repeat across runs)."""
CHECKPOINT_EVERY: Final = "FTRAIN_CHECKPOINT_EVERY"
"""Set by `ftrain run` for the trainer: the launch's `--checkpoint-every`, which wins over the script's own."""
DATASET_REVISION: Final = "FTRAIN_DATASET_REVISION"
"""Set by `ftrain run` for the trainer: the launch's `--dataset-revision`, recorded in every manifest."""
SAVE_SIGNALS: Final = "FTRAIN_SAVE_SIGNALS"
"""The signals a trainer saves and exits on (`USR1,TERM` by default; `none`: the default actions)."""
PROGRESS_DIR: Final = "FTRAIN_PROGRESS_DIR"
"""Set by `ftrain run` for the trainer: the private directory each rank reports its progress in (the hang
watchdog reads it; `ftrain.train.beacon`)."""
STOP_NOTE: Final = "FTRAIN_STOP_NOTE"
"""Set by the signal relay for the workers: a private file it writes the name of the stop signal it got into,
before it hands them the warning signal, so a worker names the signal that stopped the job."""
MAX_FAILED_SAVES: Final = "FTRAIN_MAX_FAILED_SAVES"
"""How many saves in a row may fail (object storage out of reach) before the trainer stops; default 3."""
DIGEST: Final = "FTRAIN_DIGEST"
"""The algorithm checkpoint data files are hashed with as they are written, by the trainer's saves and by
`ftrain checkpoint`: `sha256` (default) or `blake3`. Verification follows what each manifest names."""
MEMORY_EVERY: Final = "FTRAIN_MEMORY_EVERY"
"""Steps between memory snapshots (the memory tier, under the durable checkpoints); wins over the script's
`memory_every`. `0` or `off`: none. Unset: the script's (default: none)."""
MEMORY_DIR: Final = "FTRAIN_MEMORY_DIR"
"""The node-local memory the snapshots live in: a tmpfs (default /dev/shm), under `ftrain-<uid>/`."""
MEMORY_CAP_MB: Final = "FTRAIN_MEMORY_CAP_MB"
"""The most memory (MiB) one rank's snapshots may hold at once; unset: bounded by the tmpfs's free space."""

KILL_POINTS: Final = ("step", "stage", "write", "fanout", "finalize", "sealed", "snapshot_sealed", "snapshot")
"""Where FTRAIN_KILL_AT may kill (and FTRAIN_STOP_AT stop): after the optimizer step, at a phase of a save, or
at a memory snapshot of the step: sealed by every rank, before it is recorded (`snapshot_sealed`), or once it
is recorded (`snapshot`)."""
MAX_STEP_DELAY: Final = 60.0
MAX_REPLICAS: Final = 5
NATS_SCHEMES: Final = ("nats", "tls", "ws", "wss")
NATS_PORTS: Final = {"nats": 4222, "tls": 4222, "ws": 80, "wss": 443}
"""The port a server of each scheme listens on when its URL names none."""
LOG_LEVELS: Final = ("debug", "info", "warning", "error", "critical")
SAVE_SIGNAL_NAMES: Final = ("SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP", "SIGXCPU")
"""Signals a scheduler sends as a warning (SIGXCPU: PBS and LSF at a CPU-time limit); never SIGKILL/SIGSTOP."""

Env = Mapping[str, str]


class InvalidSetting(ValueError):
    """An FTRAIN_* variable holds a value ftrain cannot use."""


def _get(env: Env, name: str) -> str | None:
    """The variable's value, which must be UTF-8 text: the environment hands over bytes (a path in another
    encoding arrives surrogate-escaped), and ftrain records settings and paths in the log as text. Never
    quoted in the refusal: the value may be a secret."""
    value = env.get(name) or None
    if value is not None:
        try:
            value.encode()
        except UnicodeEncodeError as exc:
            offset, code = len(value[: exc.start].encode()), ord(value[exc.start])
            what = f"byte {code - 0xDC00:#x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
            raise InvalidSetting(f"{name} is not UTF-8 text ({what} at offset {offset})") from None
    return value


def home(env: Env = os.environ) -> Path:
    """Where this user's ftrain state lives (embedded server, read models, outbox): default
    `~/.local/share/ftrain`."""
    value = _get(env, HOME)
    return Path(value) if value else Path.home() / ".local/share/ftrain"


def storage(env: Env = os.environ) -> str:
    """The checkpoint storage root as written (a path or URI; `workers.storage.location` judges it): default
    `<home>/checkpoints`."""
    value = _get(env, STORAGE)
    if value is None:
        return str(home(env) / "checkpoints")
    parsed = urlparse(value)
    if parsed.scheme == "file":
        try:
            unquote(parsed.path, errors="strict")
        except UnicodeDecodeError:
            raise InvalidSetting(
                f"{STORAGE}={value!r}: its %-escapes are not UTF-8 (ftrain records paths as text)"
            ) from None
    return value


def nats(env: Env = os.environ) -> "NatsSettings":
    """Where the event log is and how to reach it: no URL means the embedded server under `home`."""
    from ftrain.events.jetstream.connection import NatsSettings

    url = _get(env, NATS_URL)
    if url is not None:
        _check_urls(url)
    if _get(env, NATS_PASSWORD) and not _get(env, NATS_USER):
        raise InvalidSetting(f"{NATS_PASSWORD} is set but {NATS_USER} is not")
    if _get(env, NATS_TLS_KEY) and not _get(env, NATS_TLS_CERT):
        raise InvalidSetting(f"{NATS_TLS_KEY} is set without {NATS_TLS_CERT}, the certificate it goes with")
    nkey = _get(env, NATS_NKEY)
    if nkey is not None:
        if _get(env, NATS_CREDS):
            raise InvalidSetting(f"{NATS_NKEY} and {NATS_CREDS} are both set: sign in with one of them")
        _check_nkey(nkey)
    return NatsSettings(
        home=home(env),
        url=url,
        user=_get(env, NATS_USER),
        password=_get(env, NATS_PASSWORD),
        token=_get(env, NATS_TOKEN),
        creds=_get(env, NATS_CREDS),
        nkey=nkey,
        tls_ca=_get(env, NATS_TLS_CA),
        tls_cert=_get(env, NATS_TLS_CERT),
        tls_key=_get(env, NATS_TLS_KEY),
        replicas=_replicas(env),
        trusted_keys=trusted_keys(env),
        accept_unsigned=_flag(env, ACCEPT_UNSIGNED),
        anchor_mirror=_absolute(env, ANCHOR_MIRROR),
    )


def trusted_keys(env: Env = os.environ) -> tuple[tuple[str, str], ...]:
    """(key hex, name) pairs from `FTRAIN_TRUSTED_KEYS`; a key without a name is named by its prefix."""
    entries = []
    for item in (_get(env, TRUSTED_KEYS) or "").split(","):
        if not item.strip():
            continue
        name, _, key = item.strip().rpartition("=")
        try:
            hex_key = parse_public_key(key)
        except InvalidKey as exc:
            raise InvalidSetting(f"{TRUSTED_KEYS}: {exc}") from None
        entries.append((hex_key, name.strip() or f"{KEY_PREFIX}{hex_key[:16]}"))
    return tuple(entries)


def _flag(env: Env, name: str) -> bool:
    text = _get(env, name) or "0"
    if text not in ("0", "1"):
        raise InvalidSetting(f"{name}={text[:40]!r}: use 1 or 0")
    return text == "1"


def _absolute(env: Env, name: str) -> Path | None:
    value = _get(env, name)
    if value is not None and not Path(value).is_absolute():
        raise InvalidSetting(f"{name}={value[:200]!r}: use an absolute path")
    return Path(value) if value else None


def nats_addresses(env: Env = os.environ) -> list[tuple[str, int]]:
    """The (host, port) of each server FTRAIN_NATS_URL lists (none: the embedded server, on this host)."""
    url = _get(env, NATS_URL)
    if url is None:
        return []
    _check_urls(url)
    servers = [
        urlparse(u.strip() if "://" in u else f"nats://{u.strip()}") for u in url.split(",") if u.strip()
    ]
    try:
        return [(s.hostname or "", s.port or NATS_PORTS[s.scheme.lower()]) for s in servers]
    except ValueError as exc:  # a port out of range or not a number
        raise InvalidSetting(f"{NATS_URL}={redact_urls([s.geturl() for s in servers])!r}: {exc}") from None


def _check_urls(text: str) -> None:
    """A comma list of servers, each `host:port` or `<scheme>://host:port` with a scheme nats-py speaks."""
    urls = [u.strip() for u in text.split(",") if u.strip()]
    if not urls:
        raise InvalidSetting(f"{NATS_URL}={text!r}: no server in it (use nats://host:4222[,…])")
    for url in urls:
        scheme, separator, _ = url.partition("://")
        if separator and scheme.lower() not in NATS_SCHEMES:
            raise InvalidSetting(
                f"{NATS_URL}={redact_urls(urls)!r}: {scheme}:// is not a NATS scheme "
                f"(use one of {', '.join(NATS_SCHEMES)})"
            )


def _check_nkey(path: str) -> None:
    """A readable user nkey seed file; the message never quotes its contents."""
    import nkeys

    try:
        seed = Path(path).read_bytes().strip()
    except OSError as exc:
        raise InvalidSetting(f"{NATS_NKEY}={path!r}: cannot read it ({exc.strerror or exc})") from None
    try:
        pair = nkeys.from_seed(bytearray(seed))
        user = pair.public_key.startswith(b"U")
        pair.wipe()
    except (nkeys.NkeysError, ValueError):
        user = False
    if not user:
        raise InvalidSetting(f"{NATS_NKEY}={path!r}: not a user nkey seed file (one line, SU…)")


def _replicas(env: Env) -> int:
    """Replicas of the stream ftrain creates: 1 (a single server) unless set; R3 on a cluster."""
    text = _get(env, STREAM_REPLICAS) or "1"
    if not text.isdigit() or not 1 <= int(text) <= MAX_REPLICAS:
        raise InvalidSetting(f"{STREAM_REPLICAS} must be 1..{MAX_REPLICAS}, got {text!r}")
    return int(text)


def log_level(env: Env = os.environ) -> int:
    """The structlog threshold: warning unless set, so stdout stays the command's output."""
    text = _get(env, LOG_LEVEL) or "warning"
    if text.lower() not in LOG_LEVELS:
        raise InvalidSetting(f"{LOG_LEVEL}={text!r}: use one of {', '.join(LOG_LEVELS)}")
    return logging.getLevelNamesMapping()[text.upper()]


def kill_targets(env: Env = os.environ) -> frozenset[tuple[str, int]]:
    """The injected kills, `<point>:<step>[,…]`, as (point, step) pairs; none unless set. A typo is an
    error, never a silently disabled fault."""
    return _fault_targets(env, KILL_AT)


def stop_targets(env: Env = os.environ) -> frozenset[tuple[str, int]]:
    """The injected stops (SIGSTOP: a node frozen or cut off), in FTRAIN_KILL_AT's form."""
    return _fault_targets(env, STOP_AT)


def _fault_targets(env: Env, name: str) -> frozenset[tuple[str, int]]:
    text = _get(env, name)
    targets = set()
    for item in (text or "").split(","):
        if not item.strip():
            continue
        point, _, step = item.strip().partition(":")
        if point not in KILL_POINTS or not step.isdigit():
            raise InvalidSetting(
                f"{name}={text!r}: use <point>:<step>[,…] with point one of {', '.join(KILL_POINTS)}"
            )
        targets.add((point, int(step)))
    return frozenset(targets)


def kill_once(env: Env = os.environ) -> Path | None:
    """The directory that remembers which injected kills fired, so each fires once; None: every time."""
    value = _get(env, KILL_ONCE)
    return Path(value) if value else None


def step_delay(env: Env = os.environ) -> float:
    """How long each rank sleeps at the `step` point (0 unless set): a job slowed down, so that a test or an
    experiment can act while it trains, whatever the machine's speed. At most a minute: a typo must not hang."""
    return _delay(env, STEP_DELAY)


def replica_delay(env: Env = os.environ) -> float:
    """How long this rank sleeps before each exchange of replicas with its buddy (0 unless set): a slow peer,
    whose replica is late, on any machine. At most a minute, as `step_delay`."""
    return _delay(env, REPLICA_DELAY)


def _delay(env: Env, name: str) -> float:
    """Seconds from 0 to MAX_STEP_DELAY in `name` (0 unless set); InvalidSetting otherwise."""
    text = _get(env, name) or "0"
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= MAX_STEP_DELAY:  # nan too
        raise InvalidSetting(f"{name}={text!r}: expected seconds from 0 to {MAX_STEP_DELAY:g}")
    return seconds


def run_id(env: Env = os.environ) -> str | None:
    """The run the trainer records into, as `ftrain run` set it; None outside `ftrain run`."""
    value = _get(env, RUN_ID)
    if value is None:
        return None
    try:
        return validate_run_id(value, what=RUN_ID)
    except InvalidRunId as exc:
        raise InvalidSetting(str(exc)) from exc


def attempt(env: Env = os.environ) -> int | None:
    """The attempt `ftrain run` opened for this trainer; None outside `ftrain run` (the log then tells)."""
    value = _get(env, ATTEMPT)
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise InvalidSetting(f"{ATTEMPT}={value!r}: expected an attempt number ≥ 1")
    return int(value)


def torchrun_restarts(env: Env = os.environ) -> int:
    """How many times torchrun restarted this process's workers in place (TORCHELASTIC_RESTART_COUNT; 0
    outside torchrun)."""
    value = env.get("TORCHELASTIC_RESTART_COUNT", "")
    return int(value) if value.isdigit() else 0


def ckpt_dir(env: Env = os.environ) -> Path | None:
    """The run's checkpoint directory, as `ftrain run` set it; None outside `ftrain run`."""
    value = _get(env, CKPT_DIR)
    return Path(value) if value else None


def ckpt_location(env: Env = os.environ) -> str | None:
    """FTRAIN_CKPT_DIR as written: a path, or the run's `s3://` location; None outside `ftrain run`."""
    return _get(env, CKPT_DIR) or None


def progress_dir(env: Env = os.environ) -> Path | None:
    """Where this attempt's ranks report their progress, as `ftrain run` set it; None outside `ftrain run`."""
    return _absolute(env, PROGRESS_DIR)


def max_failed_saves(env: Env = os.environ) -> int:
    """Consecutive failed saves the trainer tolerates before it stops (≥ 1; default 3)."""
    text = _get(env, MAX_FAILED_SAVES) or "3"
    if not text.isdigit() or int(text) < 1:
        raise InvalidSetting(f"{MAX_FAILED_SAVES}={text!r}: expected a whole number ≥ 1")
    return int(text)


def digest(env: Env = os.environ) -> str:
    """The digest algorithm new checkpoint data files are hashed with (FTRAIN_DIGEST; default sha256)."""
    from ftrain.workers.integrity import ALGORITHM, ALGORITHMS  # the algorithms are defined with the hashing

    text = _get(env, DIGEST) or ALGORITHM
    if text.lower() not in ALGORITHMS:
        raise InvalidSetting(f"{DIGEST}={text!r}: use one of {', '.join(ALGORITHMS)}")
    return text.lower()


def memory_every(env: Env = os.environ) -> int | None:
    """Steps between memory snapshots as FTRAIN_MEMORY_EVERY sets them (0: off); None when unset."""
    text = _get(env, MEMORY_EVERY)
    if text is None:
        return None
    if text.lower() == "off":
        return 0
    if not text.isdigit():
        raise InvalidSetting(f"{MEMORY_EVERY}={text!r}: expected a whole number of steps, or off")
    return int(text)


def memory_dir(env: Env = os.environ) -> Path:
    """The tmpfs memory snapshots are kept under (FTRAIN_MEMORY_DIR, absolute; default /dev/shm)."""
    return _absolute(env, MEMORY_DIR) or Path("/dev/shm")


def memory_cap(env: Env = os.environ) -> int | None:
    """The bytes one rank's memory snapshots may hold (FTRAIN_MEMORY_CAP_MB MiB); None: the tmpfs decides."""
    text = _get(env, MEMORY_CAP_MB)
    if text is None:
        return None
    if not text.isdigit() or int(text) < 1:
        raise InvalidSetting(f"{MEMORY_CAP_MB}={text!r}: expected a whole number of MiB ≥ 1")
    return int(text) << 20


def checkpoint_every(env: Env = os.environ) -> str | None:
    """The launch's `--checkpoint-every` as written (the trainer parses it); None when not given."""
    return _get(env, CHECKPOINT_EVERY)


def dataset_revision(env: Env = os.environ) -> str | None:
    """The launch's `--dataset-revision`; None when not given."""
    return _get(env, DATASET_REVISION)


def stop_note(env: Env = os.environ) -> Path | None:
    """The relay's note of the stop signal it got (FTRAIN_STOP_NOTE); None outside the relay."""
    value = _get(env, STOP_NOTE)
    return Path(value) if value else None


def save_signals(env: Env = os.environ) -> tuple[signal.Signals, ...]:
    """The signals the trainer turns into "save at the next step, then exit": FTRAIN_SAVE_SIGNALS, a comma
    list of names (`USR1`, `SIGTERM`, …), `none` for none; default USR1 and TERM."""
    text = _get(env, SAVE_SIGNALS) or "USR1,TERM"
    if text.strip().lower() == "none":
        return ()
    chosen = []
    for name in (part.strip().upper() for part in text.split(",")):
        full = name if name.startswith("SIG") else f"SIG{name}"
        if full not in SAVE_SIGNAL_NAMES:
            raise InvalidSetting(
                f"{SAVE_SIGNALS}={text!r}: use names among {', '.join(SAVE_SIGNAL_NAMES)}, or none"
            )
        chosen.append(signal.Signals[full])
    return tuple(dict.fromkeys(chosen))
