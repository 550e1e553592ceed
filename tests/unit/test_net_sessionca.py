"""boxyd.net.sessionca: a session's CA signs its hosts' leaves, which a client that
trusts the CA accepts for those hosts alone; its key is never in a file."""

from __future__ import annotations

import os
import socket
import ssl
import threading

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from boxyd.net.sessionca import SessionCA, bundle

HOSTS = ["api.boxy.test", "Registry.Boxy.Test."]


def _handshake(ca: SessionCA, host: str, sni: str) -> str:
    """A real TLS handshake over a socketpair: the server shows HOST's leaf, the client
    trusts the CA alone and asks for SNI. Returns the ALPN picked, or raises."""
    server_ctx = ca.server_context(host)
    client_ctx = ssl.create_default_context(cadata=ca.pem().decode())
    client_ctx.set_alpn_protocols(["h2", "http/1.1"])
    a, b = socket.socketpair()
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            with server_ctx.wrap_socket(b, server_side=True) as s:
                s.recv(1)
        except (ssl.SSLError, OSError) as e:
            failure.append(e)

    t = threading.Thread(target=serve)
    t.start()
    try:
        with client_ctx.wrap_socket(a, server_hostname=sni) as c:
            picked = c.selected_alpn_protocol() or ""
            c.send(b"x")
    finally:
        t.join(5)
    return picked


def test_a_leaf_for_a_secret_host_is_trusted_with_http11_alone() -> None:
    ca = SessionCA(HOSTS)
    assert ca.hosts == {"api.boxy.test", "registry.boxy.test"}
    assert _handshake(ca, "api.boxy.test", "api.boxy.test") == "http/1.1"
    assert _handshake(ca, "registry.boxy.test", "registry.boxy.test") == "http/1.1"


def test_a_leaf_names_its_host_only() -> None:
    ca = SessionCA(HOSTS)
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(ca, "api.boxy.test", "registry.boxy.test")


def test_no_leaf_for_another_host() -> None:
    ca = SessionCA(HOSTS)
    with pytest.raises(ValueError):
        ca.leaf("www.boxy.test")
    with pytest.raises(ValueError):
        SessionCA([])


def test_the_ca_is_constrained_to_its_hosts() -> None:
    ca = SessionCA(HOSTS)
    cert = x509.load_pem_x509_certificate(ca.pem())
    nc = cert.extensions.get_extension_for_class(x509.NameConstraints)
    assert nc.critical
    assert {n.value for n in nc.value.permitted_subtrees or []} == ca.hosts
    bc = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert bc.ca and bc.path_length == 0
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert cert.public_key().curve.name == "secp256r1"  # type: ignore[union-attr]
    life = cert.not_valid_after - cert.not_valid_before
    assert life.days <= 3


def test_a_constrained_ca_cannot_vouch_for_another_name() -> None:
    # the CA's key signing a leaf for a name outside its constraint: OpenSSL refuses
    ca = SessionCA(["api.boxy.test"])
    ca.hosts = frozenset({"api.boxy.test", "bank.example"})  # as a stolen key would
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(ca, "bank.example", "bank.example")


def test_leaves_are_kept_per_host_and_the_key_is_in_no_file() -> None:
    ca = SessionCA(HOSTS)
    before = set(os.listdir("/proc/self/fd"))
    first = ca.server_context("api.boxy.test")
    assert ca.server_context("API.boxy.test.") is first
    assert set(os.listdir("/proc/self/fd")) == before  # the memfd is closed


def test_bundle_appends_the_ca() -> None:
    ca = SessionCA(HOSTS)
    assert bundle(ca.pem(), b"HOST") == b"HOST\n" + ca.pem()
    assert bundle(ca.pem(), b"") == ca.pem()
