"""The control plane's certificates, made fresh in its working folder: a CA, serving certificates
for the API server and the webhooks (127.0.0.1), an admin client certificate
(``system:masters``) and a service-account signing key."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca_crt: Path
    ca_key: Path
    apiserver_crt: Path
    apiserver_key: Path
    admin_crt: Path
    admin_key: Path
    webhook_dir: Path  # tls.crt / tls.key for 127.0.0.1 (controller-runtime's names)
    sa_key: Path
    sa_pub: Path


def make_pki(folder: Path) -> Pki:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    valid = (now - datetime.timedelta(hours=1), now + datetime.timedelta(days=7))

    def key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )

    def write(name: str, data: bytes) -> Path:
        path = folder / name
        path.write_bytes(data)
        path.chmod(0o600)
        return path

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rcpflow-test-ca")])

    def builder(
        subject: x509.Name, key: ec.EllipticCurvePrivateKey, *, ca: bool = False
    ) -> x509.CertificateBuilder:
        """What the CA's and every leaf's certificate share: issued by the CA, valid a week."""
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(valid[0])
            .not_valid_after(valid[1])
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )

    ca = (
        builder(ca_name, ca_key, ca=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
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

    def leaf(
        cn: str,
        orgs: Sequence[str],
        *,
        server: bool,
        dns: Sequence[str] = (),
        ips: Sequence[str] = (),
    ) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        cert_builder = builder(x509.Name(attrs), key).add_extension(
            x509.ExtendedKeyUsage([usage]), critical=False
        )
        if server:
            names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
            names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
            cert_builder = cert_builder.add_extension(
                x509.SubjectAlternativeName(names), critical=False
            )
        cert = cert_builder.sign(ca_key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), key_pem(key)

    api_crt, api_key = leaf(
        "kube-apiserver",
        (),
        server=True,
        dns=(
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ),
        ips=("127.0.0.1", "10.0.0.1"),
    )
    admin_crt, admin_key = leaf("rcpflow-admin", ("system:masters",), server=False)
    hook_crt, hook_key = leaf("webhooks", (), server=True, dns=("localhost",), ips=("127.0.0.1",))
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    webhook_dir = folder / "webhook"
    webhook_dir.mkdir(exist_ok=True)
    (webhook_dir / "tls.crt").write_bytes(hook_crt)
    (webhook_dir / "tls.key").write_bytes(hook_key)
    return Pki(
        ca_crt=write("ca.crt", ca.public_bytes(serialization.Encoding.PEM)),
        ca_key=write("ca.key", key_pem(ca_key)),
        apiserver_crt=write("apiserver.crt", api_crt),
        apiserver_key=write("apiserver.key", api_key),
        admin_crt=write("admin.crt", admin_crt),
        admin_key=write("admin.key", admin_key),
        webhook_dir=webhook_dir,
        sa_key=write("sa.key", key_pem(sa)),
        sa_pub=write(
            "sa.pub",
            sa.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
        ),
    )
