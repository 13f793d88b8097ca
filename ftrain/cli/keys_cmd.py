"""`ftrain keys init|show|trust|revoke`: this user's signing key and the writers it trusts.

Files only (`events.keyring`): no connection to the log, so it works while the log is down.
"""

import argparse
from collections.abc import Mapping
from typing import Any

from ftrain import settings
from ftrain.cli.render import emit
from ftrain.errors import Refused, UsageError
from ftrain.events.jetstream.store import process_actor
from ftrain.events.keyring import keys_dir, load_signer, load_trust, revoke, trust
from ftrain.events.signing import KEY_PREFIX, InvalidKey


def keys_command(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Run one `keys` action."""
    home = settings.home(env)
    if args.keys_command in ("init", "show"):
        actor = process_actor()
        signer = load_signer(home, args.name or f"{actor.user}@{actor.host}")
        emit(f"{KEY_PREFIX}{signer.public_key}")
        if args.keys_command == "show":
            trusted = load_trust(home, settings.trusted_keys(env))
            for key, name in sorted(trusted.trusted.items(), key=lambda kv: kv[1]):
                emit(f"trusted  {KEY_PREFIX}{key} {name}")
            for key, name in sorted(trusted.revoked.items(), key=lambda kv: kv[1]):
                emit(f"revoked  {KEY_PREFIX}{key} {name}")
        else:
            emit(f"signing key in {keys_dir(home)} (share the line above with whoever must trust you)")
        return 0
    if args.keys_command == "trust":
        try:
            hex_key = trust(home, args.key, args.name)
        except InvalidKey as exc:
            raise UsageError(str(exc)) from exc
        emit(f"trusted {KEY_PREFIX}{hex_key} as {args.name}")
        return 0
    gone = revoke(home, args.key)
    if not gone:
        raise Refused(f"no trusted key matches {args.key!r}")
    for key, name in gone:
        emit(f"revoked {KEY_PREFIX}{key} ({name}): its signatures are no longer trusted")
    return 0


def add_keys_parser(sub: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    """The `keys` subcommands."""
    p = sub.add_parser("keys", help="this user's signing key and the trusted writers")
    keys = p.add_subparsers(dest="keys_command", required=True, parser_class=parser_class)
    for action, text in (("init", "make the signing key (once)"), ("show", "the key and the trust list")):
        p = keys.add_parser(action, help=text)
        p.add_argument("--name", help="the name a new key is trusted under (default user@host)")
    p = keys.add_parser("trust", help="trust another writer's public key")
    p.add_argument("name", type=_name)
    p.add_argument("key", help="ed25519:<64 hex digits>")
    p = keys.add_parser("revoke", help="stop trusting a key (or every key of a name)")
    p.add_argument("key", help="ed25519:<64 hex digits>, or a name")


def _name(text: str) -> str:
    if not text or len(text) > 200 or any(c.isspace() or not c.isprintable() for c in text):
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: a name is 1-200 printable characters, no spaces")
    return text
