"""`ftrain keys init|show|trust|revoke`: this user's signing key and the writers it trusts.

Files only (`events.keyring`): no connection to the log, so it works while the log is down. The parser is
built for every command, `--help` included: what the actions need is imported when one runs.
"""

import argparse
import os
from collections.abc import Mapping
from typing import Any

from ftrain.cli.arguments import Subparsers, command, json_flag, subcommands
from ftrain.console.output import emit, emit_json
from ftrain.errors import NotFound, UsageError


def keys_command(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Run one `keys` action. `--json`: init and show `{"public_key", "keys_dir"}`, show adding `trusted` and
    `revoked` (each `[{"key", "name"}]`); trust `{"key", "name"}`; revoke `{"revoked": [{"key", "name"}]}`."""
    from ftrain import settings
    from ftrain.events.keyring import keys_dir, load_signer, load_trust, revoke, trust
    from ftrain.events.signed_log import process_actor
    from ftrain.events.signing import KEY_PREFIX, InvalidKey

    home = settings.home(env)
    if args.keys_command in ("init", "show"):
        actor = process_actor()
        signer = load_signer(home, args.name or f"{actor.user}@{actor.host}")
        doc: dict[str, Any] = {
            "public_key": f"{KEY_PREFIX}{signer.public_key}",
            "keys_dir": str(keys_dir(home)),
        }
        lines = [doc["public_key"]]
        if args.keys_command == "show":
            trusted = load_trust(home, settings.trusted_keys(env))
            doc["trusted"], doc["revoked"] = _named(trusted.trusted), _named(trusted.revoked)
            lines += [f"trusted  {k['key']} {k['name']}" for k in doc["trusted"]]
            lines += [f"revoked  {k['key']} {k['name']}" for k in doc["revoked"]]
        else:
            lines.append(
                f"signing key in {doc['keys_dir']} (share the line above with whoever must trust you)"
            )
        return _say(args, doc, lines)
    if args.keys_command == "trust":
        try:
            hex_key = trust(home, args.key, args.name)
        except InvalidKey as exc:
            raise UsageError(str(exc)) from exc
        key = f"{KEY_PREFIX}{hex_key}"
        return _say(args, {"key": key, "name": args.name}, [f"trusted {key} as {args.name}"])
    gone = revoke(home, args.key)
    if not gone:
        raise NotFound(f"no trusted key matches {args.key!r}")
    lines = [
        f"revoked {KEY_PREFIX}{key} ({name}): its signatures are no longer trusted" for key, name in gone
    ]
    return _say(args, {"revoked": _named(dict(gone))}, lines)


def _named(keys: Mapping[str, str]) -> list[dict[str, str]]:
    """Keys as `{"key": "ed25519:…", "name"}`, by name."""
    from ftrain.events.signing import KEY_PREFIX

    return [{"key": f"{KEY_PREFIX}{k}", "name": n} for k, n in sorted(keys.items(), key=lambda kv: kv[1])]


def _say(args: argparse.Namespace, doc: dict[str, Any], lines: list[str]) -> int:
    if args.json:
        emit_json(doc)
    else:
        emit(lines)
    return 0


def add_parser(sub: Subparsers) -> None:
    """`keys` and its actions."""
    p = command(sub, "keys", "this user's signing key and the trusted writers", ["ftrain keys show"])
    keys = subcommands(p, "keys_command")
    for action, text, example in (("init", "make the signing key (once)", "ftrain keys init --name alice@lab"),
                                  ("show", "the key and the trust list", "ftrain keys show --json")):  # fmt: skip
        p = command(keys, action, text, [example])
        p.add_argument("--name", help="the name a new key is trusted under (default user@host)")
        json_flag(p, "the key" if action == "init" else "the key and the trust list")
    p = command(keys, "trust", "trust another writer's public key", ["ftrain keys trust bob@lab ed25519:3f…"])
    p.add_argument("name", type=_name, help="the name its signatures are shown under")
    p.add_argument("key", help="ed25519:<64 hex digits>")
    json_flag(p, "the key trusted")
    p = command(
        keys, "revoke", "stop trusting a key (or every key of a name)", ["ftrain keys revoke bob@lab"]
    )
    p.add_argument("key", help="ed25519:<64 hex digits>, or a name")
    json_flag(p, "the keys revoked")
    for action in keys.choices.values():
        action.set_defaults(entry=lambda args: keys_command(args, os.environ))


def _name(text: str) -> str:
    if not text or len(text) > 200 or any(c.isspace() or not c.isprintable() for c in text):
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: a name is 1-200 printable characters, no spaces")
    return text
