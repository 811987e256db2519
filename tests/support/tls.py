"""TLS material generated at test time with the ``openssl`` command (Debian's openssl).

    ca = CertificateAuthority.create(tmp / "ca", "test-ca")
    server = ca.issue("broker", server=True)          # SAN 127.0.0.1 and localhost
    client = ca.issue("alice", client=True)           # for mutual TLS
    server.keystore                                    # key + chain in one PEM (Kafka's PEM keystore)

Keys are EC P-256 in unencrypted PKCS#8 PEM, which Python's ``ssl``, librdkafka and
Kafka's ``ssl.keystore.type=PEM`` all read; certificates are valid for two days.
Nothing is committed: every test run makes its own CA.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

OPENSSL_TIMEOUT = 60.0


def _openssl(cwd: Path, *args: str) -> None:
    done = subprocess.run(
        ["openssl", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=OPENSSL_TIMEOUT,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {done.stdout}{done.stderr}")


_EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, as PEM files."""

    name: str
    cert: Path
    key: Path
    keystore: Path
    """The key followed by the certificate, one PEM file (Kafka's PEM keystore format)."""


@dataclass(frozen=True)
class CertificateAuthority:
    name: str
    dir: Path
    cert: Path
    key: Path

    @classmethod
    def create(cls, directory: Path, name: str) -> CertificateAuthority:
        directory.mkdir(parents=True, exist_ok=True)
        _openssl(
            directory,
            "req", "-x509", *_EC_KEY, "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "2", "-subj", f"/CN={name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
        return cls(name, directory, directory / "ca.pem", directory / "ca.key")

    def issue(self, name: str, *, server: bool = False, client: bool = False) -> Issued:
        """A certificate for CN=*name*: ``server`` adds serverAuth and SANs for loopback,
        ``client`` adds clientAuth."""
        if not (server or client):
            raise ValueError("a certificate for a server, a client, or both")
        usages = [u for u, on in (("serverAuth", server), ("clientAuth", client)) if on]
        ext = [
            "basicConstraints=CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            f"extendedKeyUsage={','.join(usages)}",
        ]
        if server:
            ext.append("subjectAltName=DNS:localhost,IP:127.0.0.1")
        (self.dir / f"{name}.ext").write_text("\n".join(ext) + "\n")
        _openssl(
            self.dir,
            "req", *_EC_KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN={name}",
        )  # fmt: skip
        _openssl(
            self.dir,
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
        )  # fmt: skip
        cert, key = self.dir / f"{name}.pem", self.dir / f"{name}.key"
        keystore = self.dir / f"{name}-keystore.pem"
        keystore.write_text(key.read_text() + cert.read_text())
        return Issued(name, cert, key, keystore)
