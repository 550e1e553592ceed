"""A throwaway test CA and its server certificates, made with the `openssl` CLI.

EC P-256 keys (generated in well under a second), valid for a week; the CA
certificate goes to `ca.pem`, which tests hand to curl/node/python in a sandbox.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

OPENSSL = "/usr/bin/openssl"
_DAYS = "7"

_CONFIG = """[req]
distinguished_name = dn
prompt = no
[dn]
CN = {cn}
[ext]
{ext}
"""
_CA_EXT = """basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash"""
_LEAF_EXT = """basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
subjectAltName = {san}"""


def _req(
    out_dir: Path, label: str, cn: str, ext: str, ca: tuple[Path, Path] | None
) -> subprocess.Popen[bytes]:
    cnf = out_dir / f"{label}.cnf"
    cnf.write_text(_CONFIG.format(cn=cn, ext=ext))
    argv = [
        OPENSSL,
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        str(out_dir / f"{label}.key"),
        "-out",
        str(out_dir / f"{label}.pem"),
        "-days",
        _DAYS,
        "-config",
        str(cnf),
        "-extensions",
        "ext",
    ]
    if ca is not None:
        argv += ["-CA", str(ca[0]), "-CAkey", str(ca[1])]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _wait(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    for label, p in procs.items():
        _, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(
                f"openssl failed making the {label} certificate: "
                f"{err.decode(errors='replace').strip()}"
            )


def make_pki(
    out_dir: Path, certs: dict[str, tuple[str, ...]], ips: tuple[str, ...] = ()
) -> dict[str, tuple[Path, Path]]:
    """Write ca.pem/ca.key and, per label, LABEL.pem/LABEL.key with those DNS names as
    SANs (the first certificate, "main", also gets IPS). Returns label -> (cert, key)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _wait({"CA": _req(out_dir, "ca", "boxy test CA", _CA_EXT, None)})
    ca = (out_dir / "ca.pem", out_dir / "ca.key")
    procs: dict[str, subprocess.Popen[bytes]] = {}
    for i, (label, names) in enumerate(certs.items()):
        san = [f"DNS:{n}" for n in names] + ([f"IP:{a}" for a in ips] if i == 0 else [])
        procs[label] = _req(out_dir, label, names[0], _LEAF_EXT.format(san=",".join(san)), ca)
    _wait(procs)
    (out_dir / "ca.pem").chmod(0o644)  # the unprivileged test user copies it into sandboxes
    return {label: (out_dir / f"{label}.pem", out_dir / f"{label}.key") for label in certs}
