"""The gateway's TLS pair checked for real: site.yml's play 0 on localhost gateways, where
community.crypto reads the certificate and the key on the controller and the role refuses a bad
pair naming the variable, before anything changes, without ever showing the key."""

import datetime
import json
import subprocess
import sys

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ansible_run import run_playbook


def _pair(tmp_path, name, days=2):
    key, cert = tmp_path / f"{name}.key", tmp_path / f"{name}.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", str(days), "-subj", f"/CN={name}"], check=True, capture_output=True)
    return cert.read_text(), key.read_text()


def _expired_pair(name):
    """A self-signed certificate whose validity ended yesterday (openssl req cannot make one)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=10))
            .not_valid_after(now - datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM).decode(), key_pem.decode()


def _play_0(tmp_path, cert, key):
    """site.yml's checks (tags always) on one localhost gateway with this pair; its result."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    gateway = {"ansible_host": "192.0.2.31", "sglang_gateway_api_keys": ["sk-roles-test-tls-0123456789"],
               "sglang_gateway_tls_cert": cert, "sglang_gateway_tls_key": key}
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"vars": local, "children": {
        "sglang_gateways": {"hosts": {"gw": gateway}},
        "sglang_nodes": {"hosts": {"n1": {"sglang_worker_host": "192.0.2.11"}}},
    }}}), encoding="utf-8")
    return run_playbook("site.yml", inventory, tags=["sglang_gateway_tls_test"], limit="sglang_gateways")


def _refusal(result, key):
    assert result.rc != 0, result.stdout[-3000:]
    assert result.count("changed") == 0
    message = " ".join(result.failure_messages())
    body = "".join(key.strip().splitlines()[1:-1])
    shown = result.stdout + json.dumps(result.events)
    assert not any(body[i:i + 16] in shown for i in range(0, len(body) - 16, 16)), "a piece of the key was shown"
    return message


def test_a_matching_pair_passes_the_checks(tmp_path):
    cert, key = _pair(tmp_path, "gw")
    result = _play_0(tmp_path, cert, key)
    assert result.rc == 0, " ".join(result.failure_messages()) or result.stdout[-3000:]


def test_a_key_of_another_certificate_is_refused_naming_the_certificate(tmp_path):
    cert, _ = _pair(tmp_path, "gw")
    _, other_key = _pair(tmp_path, "other")
    fingerprint = subprocess.run(["openssl", "x509", "-noout", "-fingerprint", "-sha256", "-in", str(tmp_path / "gw.pem")],
                                 check=True, capture_output=True, text=True).stdout.strip().split("=", 1)[1]
    message = _refusal(_play_0(tmp_path, cert, other_key), other_key)
    assert ("sglang_gateway_tls_cert and sglang_gateway_tls_key: the certificate's public key is not the key's "
            f"(certificate commonName=gw, SHA-256 {fingerprint})") in message


@pytest.mark.parametrize("broken", ["cert", "key"])
def test_text_that_is_no_pem_is_refused_naming_the_variable(tmp_path, broken):
    cert, key = _pair(tmp_path, "gw")
    if broken == "cert":
        message = _refusal(_play_0(tmp_path, "not a cert", key), key)
        assert "sglang_gateway_tls_cert: expected a PEM certificate" in message
    else:
        secret = "secret-looking text 0123456789abcdef0123456789abcdef"
        message = _refusal(_play_0(tmp_path, cert, secret), secret)
        assert "sglang_gateway_tls_key: expected an unencrypted PEM private key" in message
        assert "secret-looking" not in message


def test_an_expired_certificate_is_refused(tmp_path):
    cert, key = _expired_pair("gw")
    message = _refusal(_play_0(tmp_path, cert, key), key)
    assert "sglang_gateway_tls_cert: expired on " in message and "expected a valid certificate" in message
