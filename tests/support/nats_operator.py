"""A throwaway NATS operator, account and user, made with nkeys: decentralized-auth (creds file) servers for tests.

The JWTs are the NATS v2 claim format signed with ed25519 nkeys, as `nsc` would write them.
"""

import base64
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import nkeys

UNLIMITED = {"subs": -1, "conn": -1, "leaf": -1, "imports": -1, "exports": -1, "data": -1, "payload": -1,
             "wildcards": True}  # fmt: skip
JETSTREAM = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}


def _keypair(prefix: int) -> nkeys.KeyPair:
    return nkeys.from_seed(nkeys.encode_seed(os.urandom(32), prefix))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _jwt(issuer: nkeys.KeyPair, subject: nkeys.KeyPair, name: str, nats: dict[str, Any]) -> str:
    claims: dict[str, Any] = {"iat": int(time.time()), "iss": issuer.public_key.decode(), "name": name,
                              "sub": subject.public_key.decode(), "nats": {**nats, "version": 2}}  # fmt: skip
    claims["jti"] = (
        base64.b32encode(hashlib.sha256(json.dumps(claims).encode()).digest()).decode().rstrip("=")
    )
    signed = f"{_b64(json.dumps({'typ': 'JWT', 'alg': 'ed25519-nkey'}).encode())}.{_b64(json.dumps(claims).encode())}"
    return f"{signed}.{_b64(issuer.sign(signed.encode()))}"


def operator_setup(directory: Path, port: int) -> tuple[str, Path]:
    """A server config (operator mode, memory resolver, JetStream) and a user's creds file for it."""
    operator, system, account, user = (
        _keypair(p) for p in (nkeys.PREFIX_BYTE_OPERATOR, nkeys.PREFIX_BYTE_ACCOUNT, nkeys.PREFIX_BYTE_ACCOUNT,
                              nkeys.PREFIX_BYTE_USER)
    )  # fmt: skip
    system_id = system.public_key.decode()
    config = (
        f"listen: 127.0.0.1:{port}\n"
        f"operator: {_jwt(operator, operator, 'op', {'type': 'operator', 'system_account': system_id})}\n"
        f"system_account: {system_id}\nresolver: MEMORY\nresolver_preload: {{\n"
        f"  {system_id}: {_jwt(operator, system, 'SYS', {'type': 'account', 'limits': UNLIMITED})}\n"
        f"  {account.public_key.decode()}: "
        f"{_jwt(operator, account, 'train', {'type': 'account', 'limits': {**UNLIMITED, **JETSTREAM}})}\n}}\n"
        f'jetstream {{ store_dir: "{directory / "js"}" }}\n'
    )
    user_jwt = _jwt(account, user, "trainer", {"type": "user", "pub": {}, "sub": {}, "subs": -1, "data": -1,
                                               "payload": -1})  # fmt: skip
    creds = directory / "trainer.creds"
    directory.mkdir(parents=True, exist_ok=True)
    creds.write_text(
        f"-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{user.seed.decode()}\n------END USER NKEY SEED------\n"
    )
    return config, creds
