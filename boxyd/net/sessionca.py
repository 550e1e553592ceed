"""A session's certificate authority (`--secret NAME@HOST`): the certificates the
gateway shows the payload for the secrets' hosts, and only for them.

Made with the `cryptography` package: the standard library cannot make a key pair or
a certificate, and writing DER by hand is the kind of code that fails quietly;
cryptography is the well-kept tool for X.509 (OpenSSL's, maintained by the PyCA).

The CA's key lives in boxyd's memory for the session and is never written anywhere;
its certificate (public) is what the sandbox trusts. The CA is limited by a name
constraint to the secrets' hosts: even a stolen key signs nothing else a
constraint-checking client would accept. Leaf certificates are made on first use,
per host, and kept for the session; both expire soon after the session could.
"""

from __future__ import annotations

import datetime
import os
import ssl
from collections.abc import Iterable

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# a session lasts as long as its payload; a leaf is remade past half of this
VALIDITY = datetime.timedelta(days=2)
_SKEW = datetime.timedelta(minutes=5)  # a sandbox clock a little behind the host's


class SessionCA:
    """One session's CA over HOSTS (names, lowercase, no trailing dot)."""

    def __init__(self, hosts: Iterable[str], *, label: str = "boxy session") -> None:
        self.hosts = frozenset(h.lower().rstrip(".") for h in hosts)
        if not self.hosts:
            raise ValueError("a session CA needs at least one host")
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self.expires = now + VALIDITY
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{label} CA")])
        permitted: list[x509.GeneralName] = [x509.DNSName(h) for h in sorted(self.hosts)]
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _SKEW)
            .not_valid_after(self.expires)
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
            )  # fmt: skip
            .add_extension(x509.NameConstraints(permitted, None), critical=True)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        self._leaves: dict[str, tuple[datetime.datetime, ssl.SSLContext]] = {}

    def pem(self) -> bytes:
        """The CA's certificate, for the sandbox's trust store."""
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def leaf(self, host: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        """A fresh certificate for HOST (one of the CA's hosts) and its key."""
        host = host.lower().rstrip(".")
        if host not in self.hosts:
            raise ValueError(f"{host}: not a host of this session's secrets")
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        ca_key = self._key.public_key()
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _SKEW)
            .not_valid_after(min(now + VALIDITY, self.expires))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        return cert, key

    def server_context(self, host: str) -> ssl.SSLContext:
        """The TLS server side the gateway shows the payload for HOST: the leaf made on
        first use and kept (remade past half its life), HTTP/1.1 alone in ALPN (the
        swap reads HTTP/1.1; a client offering h2 only gets no ALPN, and its h2 is cut
        as unreadable)."""
        host = host.lower().rstrip(".")
        now = datetime.datetime.now(datetime.UTC)
        kept = self._leaves.get(host)
        if kept is not None and now < kept[0]:
            return kept[1]
        cert, key = self.leaf(host)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])
        _load(ctx, cert, key)
        self._leaves[host] = (now + VALIDITY / 2, ctx)
        return ctx


def _load(ctx: ssl.SSLContext, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
    """ssl reads a certificate chain and key only from a file: an anonymous one in
    memory (memfd), gone when closed — the key is never on a disk."""
    pem = cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.memfd_create("boxy-leaf", os.MFD_CLOEXEC)
    try:
        os.write(fd, pem)
        ctx.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def bundle(ca_pem: bytes, host_bundle: bytes) -> bytes:
    """The sandbox's certificate bundle: the host's, then the session's CA."""
    sep = b"" if not host_bundle or host_bundle.endswith(b"\n") else b"\n"
    return host_bundle + sep + ca_pem
