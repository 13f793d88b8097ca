"""What makes the embedded SeaweedFS private to its user: a ``security.toml`` that puts every port but S3 behind
mutual TLS, and the keys it names.

``weed server`` opens, besides the S3 gateway, a master, a volume server and a filer (HTTP each) and a gRPC
port for all four, all on 127.0.0.1 and, by default, open to any local user (the filer serves and takes every
object). SeaweedFS reads ``security.toml`` from its working directory first (the 0700 ``<home>/seaweedfs``).
There: ``[grpc.*]`` and ``[https.*]`` require a client certificate from a CA of our own on every gRPC and HTTP
port but S3's (the ports answer nothing else, not even the master's ``/dir/assign`` or ``/cluster/status``);
``[jwt.*]`` also makes the volume server and the filer demand a signed token for each write and read, as a
second lock. The gateway's own traffic to the volume server (every object's bytes) is TLS too. The CA's private
key is never written down: it signs the one certificate the services share, for 127.0.0.1 (one process, one
trust domain), and is dropped, so a stolen copy of the directory cannot mint another. Kept under ``tls/`` and ``jwt`` (0600) across restarts, like the S3 keys; a certificate
that is missing, unreadable or close to expiry is issued again with a new CA.
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from pathlib import Path
from typing import Final

import msgspec
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ftrain.host.atomic_file import write_atomic
from ftrain.host.private_files import private_dir

CERT_DAYS: Final = 3650
RENEW_DAYS: Final = 30
SERVICES: Final = ("master", "volume", "filer", "s3")
JWT_SECTIONS: Final = ("jwt.signing", "jwt.signing.read", "jwt.filer_signing", "jwt.filer_signing.read")


class TlsFiles(msgspec.Struct, frozen=True):
    """The CA certificate and the shared service certificate and key, as paths."""

    ca: Path
    cert: Path
    key: Path


def tls_files(directory: Path) -> TlsFiles:
    """Where the certificates live under `directory` (``<home>/seaweedfs``)."""
    tls = directory / "tls"
    return TlsFiles(ca=tls / "ca.pem", cert=tls / "cert.pem", key=tls / "key.pem")


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _issue(files: TlsFiles) -> None:
    """A fresh CA, the service certificate it signs (server and client use, 127.0.0.1), the CA key dropped."""
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=CERT_DAYS)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("ftrain seaweedfs CA")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("ftrain-seaweedfs"))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    write_atomic(
        files.key,
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
    write_atomic(files.cert, cert.public_bytes(pem))
    write_atomic(files.ca, ca.public_bytes(pem))


def _usable(files: TlsFiles) -> bool:
    """The kept certificate reads, is signed by the kept CA, matches the kept key and is far from expiry."""
    try:
        ca = x509.load_pem_x509_certificate(files.ca.read_bytes())
        cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
        key = serialization.load_pem_private_key(files.key.read_bytes(), password=None)
        cert.verify_directly_issued_by(ca)
    except (OSError, ValueError, TypeError, InvalidSignature):
        return False
    left = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    return key.public_key() == cert.public_key() and left > datetime.timedelta(days=RENEW_DAYS)


def _jwt_keys(directory: Path) -> list[str]:
    """One signing key per JWT section, generated once and kept (``jwt``, 0600)."""
    path = directory / "jwt"
    try:
        keys = path.read_text().split()
    except OSError:
        keys = []
    if len(keys) != len(JWT_SECTIONS):
        keys = [secrets.token_hex(32) for _ in JWT_SECTIONS]
        write_atomic(path, ("\n".join(keys) + "\n").encode())
    return keys


def _toml(files: TlsFiles, jwt_keys: list[str]) -> str:
    def q(value: str | Path) -> str:  # a TOML basic string (JSON's escapes are TOML's)
        return msgspec.json.encode(str(value)).decode()

    pair = f"cert = {q(files.cert)}\nkey = {q(files.key)}\n"
    lines = [
        f"[{s}]\nkey = {q(k)}\nexpires_after_seconds = 10\n"
        for s, k in zip(JWT_SECTIONS, jwt_keys, strict=True)
    ]
    lines += ["[access]\nui = false\n", "[filer.expose_directory_metadata]\nenabled = false\n"]
    lines += [f"[grpc]\nca = {q(files.ca)}\n"]
    lines += [f"[grpc.{s}]\n{pair}" for s in (*SERVICES, "client")]
    lines += [f"[https.client]\nenabled = true\n{pair}ca = {q(files.ca)}\n"]
    lines += [f"[https.{s}]\n{pair}ca = {q(files.ca)}\n" for s in ("master", "volume", "filer")]
    return "\n".join(lines)


def write_security(directory: Path) -> Path:
    """``<directory>/security.toml`` (0600) naming the kept certificates and JWT keys, made when missing."""
    files = tls_files(directory)
    private_dir(files.ca.parent)
    if not _usable(files):
        _issue(files)
    path = directory / "security.toml"
    write_atomic(path, _toml(files, _jwt_keys(directory)).encode())
    return path
