"""A job's credentials: its secret, learner tokens, and its own CA, server certificate and relay certificates.

Everything is generated on the laptop with ``cryptography``; the CA key never
leaves it. The syncer gets the server key and the secret; learners get their
own token and the CA certificate, which they pin (no public CA is trusted).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import ipaddress
import json
import os
import secrets
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ddctl.errors import DdctlError
from ddctl_agents.errors import AgentError
from ddctl_agents.jsonable import to_json
from ddctl_agents.relay import server_name
from ddctl_agents.service.auth import ADMIN, check_identity, derive_token, read_secret, relay_key
from ddctl_agents.train.job import JobConfig
from ddctl_agents.train.modelfiles import ship

VALID_DAYS = 30


def _write(path: Path, data: bytes, private: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = os.open(path, flags, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def write_private(path: Path, text: str) -> Path:
    """``text`` and a newline in a file only its owner can read (a token, a key), its folder made if need be."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _write(path, (text + "\n").encode(), private=True)
    return path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ddctl"), x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_tls(directory: Path, run: str, hosts: list[str]) -> None:
    """A CA for this run and a server certificate for ``hosts`` (IP addresses or DNS names)."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name(f"ddctl CA {run}"))
        .issuer_name(_name(f"ddctl CA {run}"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    _write(directory / "ca.pem", ca.public_bytes(pem), private=False)
    _write(directory / "ca.key", ca_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()), True)
    _issue(directory, "server", f"ddctl syncer {run}", hosts, ca, ca_key)


def relay_tls(directory: Path, region: str) -> tuple[Path, Path]:
    """Region ``region``'s relay certificate and key in the job's ``tls/`` (made once, signed by the job's CA).

    It names only ``relay.server_name(region)``, which learners check whatever address they reach the relay at: a
    relay's address is known only once its machine is up, and a relay (on a learner's machine) never holds the
    synchronizer's key, so it cannot pose as a shard, nor as another region's relay."""
    try:
        check_identity(region)  # it names files
    except AgentError as exc:
        raise DdctlError(f"relay region: {exc}") from None
    tls = directory / "tls"
    cert, key = tls / f"relay-{region}.pem", tls / f"relay-{region}.key"
    if not (cert.is_file() and key.is_file()):
        try:
            ca = x509.load_pem_x509_certificate((tls / "ca.pem").read_bytes())
            ca_key = serialization.load_pem_private_key((tls / "ca.key").read_bytes(), password=None)
        except (OSError, ValueError) as exc:
            raise DdctlError(f"{tls}: the job's CA cannot sign a relay certificate: {exc}") from None
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise DdctlError(f"{tls / 'ca.key'}: not the EC key ddctl makes")
        _issue(tls, f"relay-{region}", f"ddctl relay {region}", [server_name(region)], ca, ca_key)
    return cert, key


def _issue(
    directory: Path, stem: str, common: str, hosts: list[str], ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey
) -> None:
    """``directory/STEM.pem`` and ``.key``: a server certificate for ``hosts`` (IP addresses or DNS names), signed by ``ca``."""
    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    pem, pkcs8 = serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8
    _write(directory / f"{stem}.key", key.private_bytes(pem, pkcs8, serialization.NoEncryption()), private=True)
    _write(directory / f"{stem}.pem", cert.public_bytes(pem), private=False)


def init_job_dir(directory: Path, job: JobConfig, run: str, hosts: list[str], tls: bool = True) -> Path:
    """Write job.json, a fresh secret and (with ``tls``) the run's CA and server certificate."""
    if (directory / "job.json").exists():
        raise DdctlError(f"{directory} already holds a job; pick an empty directory (nothing was changed)")
    directory.mkdir(parents=True, exist_ok=True)
    if job.inner.model:  # your model's source travels with the job (JOB_DIR/model/), named as the agents import it
        job = dataclasses.replace(job, inner=dataclasses.replace(job.inner, model=ship(job.inner.model, directory)))
    _write(directory / "secret", (secrets.token_hex(32) + "\n").encode(), private=True)
    if tls:
        make_tls(directory / "tls", run, hosts)
    _write(directory / "job.json", (json.dumps({"run": run, "job": to_json(job)}, indent=2) + "\n").encode(), private=False)
    return directory


def token_for(directory: Path, identity: str) -> str:
    """The token ``identity`` (a learner name, or ``admin``) presents to this job's syncer."""
    try:
        return derive_token(_secret(directory), identity)
    except AgentError as exc:
        raise DdctlError(f"{directory}: {exc}") from None


def relay_key_for(directory: Path, region: str) -> bytes:
    """Region ``region``'s relay key (``auth.relay_key``): the relay checks its learners' tokens with it."""
    try:
        return relay_key(_secret(directory), region)
    except AgentError as exc:
        raise DdctlError(f"{directory}: {exc}") from None


def relay_token_for(directory: Path, region: str, learner: str) -> str:
    """The token ``learner`` presents to its region's relay (useless to the synchronizer and to other regions' relays)."""
    try:
        return derive_token(relay_key_for(directory, region), learner)
    except AgentError as exc:
        raise DdctlError(f"{directory}: {exc}") from None


def _secret(directory: Path) -> bytes:
    try:
        return read_secret((directory / "secret").read_text())
    except OSError as exc:
        raise DdctlError(f"{directory / 'secret'}: cannot read ({exc.strerror})") from None


__all__ = ["ADMIN", "init_job_dir", "make_tls", "relay_key_for", "relay_tls", "relay_token_for", "token_for", "write_private"]
