"""What storage.tls and determined.tls check alike before their certificates are read: a
certificate needs its key and the key its certificate (MinIO and Determined read both), and a
CA is only meaningful beside a certificate (deploy/cluster/storage_tls.py, master_tls.py).
"""

from __future__ import annotations

from deploy.cluster.reader import Map, Reader


def halves_given(
    r: Reader, m: Map, section: str, ca: object | None, without_key: str, without_cert: str
) -> dict[str, bool]:
    """Which of `section`'s certificate, private_key and ca_certificate are written; reports
    half a pair (`without_key`, `without_cert`: what the server says of the missing half) and
    a CA (`ca`, as loaded) without a certificate."""
    raw = m.raw("tls")
    written = raw if isinstance(raw, dict) else {}
    given = {k: written.get(k) is not None for k in ("certificate", "private_key", "ca_certificate")}
    if given["certificate"] and not given["private_key"]:
        r.add(
            f"{section}.private_key", "(missing)", f"{section}.certificate needs its private key{without_key}"
        )
    if given["private_key"] and not given["certificate"]:
        r.add(
            f"{section}.certificate",
            "(missing)",
            f"{section}.private_key needs its certificate{without_cert}",
        )
    if given["ca_certificate"] and not given["certificate"]:
        r.add(f"{section}.ca_certificate", str(ca or "(given)"), f"a CA without {section}.certificate")
    return given
