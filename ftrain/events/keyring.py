"""This user's signing key and trust list, kept private under `<home>/keys/`.

- `signing.key`: the Ed25519 private key (PKCS#8 PEM), 0600, made on first use;
- `trusted`: one `ed25519:<hex> <name>` line per key allowed to write (this user's own key is added when it is
  made); `#` starts a comment;
- `revoked`: the same form, keys once trusted and no longer: their signatures are reported as revoked.

The directory is 0700 and every file 0600 whatever the umask: the private key signs for this user, and the
trust list decides whose events are acted on, so another user must be able to read neither nor change them.
"""

import contextlib
import fcntl
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)

from ftrain.events.signing import KEY_PREFIX, InvalidKey, Signer, TrustList, parse_public_key
from ftrain.host.atomic_file import write_atomic
from ftrain.host.private_files import private_dir

KEY_FILE = "signing.key"
TRUSTED_FILE = "trusted"
REVOKED_FILE = "revoked"
MAX_LIST_BYTES = 1 << 20


class KeyringError(RuntimeError):
    """The key or a trust list cannot be read or is malformed: never guessed around."""


def keys_dir(home: Path) -> Path:
    """`<home>/keys`, the home and it made 0700 with every missing parent; either one another user owns or
    could have written to raises UnsafeDirectory: a key or trust list planted there must never be used."""
    private_dir(Path(home))
    return private_dir(Path(home) / "keys")


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def load_signer(home: Path, name: str) -> Signer:
    """This user's signer; the first call makes the key (and trusts it as `name`)."""
    directory = keys_dir(home)
    path = directory / KEY_FILE
    if not path.exists():
        with _locked(directory):
            if not path.exists():
                return _create(directory, name)
    try:
        key = load_pem_private_key(_read_private(path), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise KeyringError(f"cannot read the signing key {path}: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyringError(f"{path} does not hold an Ed25519 private key")
    return Signer(key)


def _read_private(path: Path) -> bytes:
    """The key file's bytes, refusing a symlink or a file other users could read."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        if os.fstat(fd).st_mode & 0o077:
            raise KeyringError(f"{path} is readable by other users: chmod 600 it (and replace the key)")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(MAX_LIST_BYTES)
    finally:
        os.close(fd)


def _create(directory: Path, name: str) -> Signer:
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    write_atomic(directory / KEY_FILE, pem)
    signer = Signer(key)
    _write_list(directory / TRUSTED_FILE, {**_read_list(directory / TRUSTED_FILE), signer.public_key: name})
    return signer


def load_trust(
    home: Path, extra: Iterable[tuple[str, str]] = (), *, accept_unsigned: bool = False
) -> TrustList:
    """The trust list under `home`, plus `extra` (key hex, name) pairs (from `FTRAIN_TRUSTED_KEYS`)."""
    directory = keys_dir(home)
    revoked = _read_list(directory / REVOKED_FILE)
    trusted = {**_read_list(directory / TRUSTED_FILE), **dict(extra)}
    return TrustList({k: n for k, n in trusted.items() if k not in revoked}, revoked, accept_unsigned)


def trust(home: Path, key: str, name: str) -> str:
    """Add `key` to the trust list as `name` (un-revoking it); returns its hex. Raises InvalidKey."""
    hex_key = parse_public_key(key)
    directory = keys_dir(home)
    with _locked(directory):
        revoked = _read_list(directory / REVOKED_FILE)
        if revoked.pop(hex_key, None) is not None:
            _write_list(directory / REVOKED_FILE, revoked)
        _write_list(directory / TRUSTED_FILE, {**_read_list(directory / TRUSTED_FILE), hex_key: name})
    return hex_key


def revoke(home: Path, key_or_name: str) -> list[tuple[str, str]]:
    """Move the keys matching `key_or_name` (a key, or a name) from the trust list to the revoked list;
    returns them (empty: nothing matched)."""
    directory = keys_dir(home)
    with _locked(directory):
        trusted = _read_list(directory / TRUSTED_FILE)
        try:
            wanted = {parse_public_key(key_or_name)}
        except InvalidKey:
            wanted = {k for k, n in trusted.items() if n == key_or_name}
        gone = [(k, trusted.pop(k)) for k in sorted(wanted) if k in trusted]
        if gone:
            _write_list(directory / REVOKED_FILE, {**_read_list(directory / REVOKED_FILE), **dict(gone)})
            _write_list(directory / TRUSTED_FILE, trusted)
    return gone


def parse_list(text: str, where: str) -> dict[str, str]:
    """`ed25519:<hex> <name>` lines → {hex: name}; raises KeyringError naming the line."""
    entries: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        key, _, name = line.partition(" ")
        try:
            entries[parse_public_key(key)] = name.strip() or key
        except InvalidKey as exc:
            raise KeyringError(f"{where}:{number}: {exc}") from None
    return entries


def _read_list(path: Path) -> dict[str, str]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise KeyringError(f"cannot read {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_LIST_BYTES + 1)
    if len(data) > MAX_LIST_BYTES:
        raise KeyringError(f"{path} exceeds {MAX_LIST_BYTES} bytes")
    return parse_list(data.decode("utf-8", "replace"), str(path))


def _write_list(path: Path, entries: dict[str, str]) -> None:
    lines = [f"{KEY_PREFIX}{key} {name}\n" for key, name in entries.items()]
    write_atomic(path, "".join(lines).encode())
