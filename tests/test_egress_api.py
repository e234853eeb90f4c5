"""Egress settings through the API of a real ingress process (SPEC, "Egress"): tls, proxy
and auth are stored, shown without their secrets (fingerprints, `*_set`), replaced or
removed by PATCH; bad input is a 422 naming the field, and nothing is written."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import psycopg
import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from engine.testing.ingress_server import IngressProcess
from tests.kit.api import assert_error, count, make_destination


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def client(ca: trustme.CA) -> trustme.LeafCert:
    return ca.issue_cert("engine-client.example")


def _sha256(pem: bytes) -> str:
    cert = x509.load_pem_x509_certificate(pem)
    return hashlib.sha256(cert.public_bytes(Encoding.DER)).hexdigest()


def tls_of(ca: trustme.CA, leaf: trustme.LeafCert) -> dict:
    return {"client_cert": leaf.cert_chain_pems[0].bytes().decode(),
            "client_key": leaf.private_key_pem.bytes().decode(),
            "ca_bundle": ca.cert_pem.bytes().decode()}


AUTH = {"type": "oauth2_client_credentials", "token_url": "http://127.0.0.1:9/token",
        "client_id": "engine", "client_secret": "s3cr3t-value", "scope": "webhooks"}


def test_egress_is_stored_and_read_without_secrets(
    api: IngressProcess, db: psycopg.Connection, ca: trustme.CA, client: trustme.LeafCert
) -> None:
    created = make_destination(api, tls=tls_of(ca, client), proxy="http://127.0.0.1:3128",
                               auth=AUTH)
    leaf_sha = _sha256(client.cert_chain_pems[0].bytes())
    expected_tls = {"client_cert_sha256": leaf_sha, "client_key_set": True,
                    "ca_bundle_sha256": [_sha256(ca.cert_pem.bytes())]}
    expected_auth = {"type": "oauth2_client_credentials",
                     "token_url": "http://127.0.0.1:9/token", "client_id": "engine",
                     "scope": "webhooks", "client_secret_set": True}
    path = f"/v1/destinations/{created['id']}"
    listed = api.request("GET", "/v1/destinations").json()["data"][0]
    for shown in (created, api.request("GET", path).json(), listed):
        assert shown["tls"] == expected_tls
        assert shown["auth"] == expected_auth
        assert shown["proxy"] == "http://127.0.0.1:3128"
        text = str(shown)
        assert "PRIVATE KEY" not in text and "s3cr3t-value" not in text
    revision = db.execute("SELECT egress_revision FROM destinations").fetchone()[0]
    assert revision is not None

    # A PATCH replaces a setting whole, and a new revision makes workers read it again.
    patched = api.request("PATCH", path, {"proxy": None, "tls": None}).json()
    assert patched["proxy"] is None and patched["tls"] is None
    assert patched["auth"] == expected_auth
    after = db.execute("SELECT egress_revision FROM destinations").fetchone()[0]
    assert after is not None and after != revision
    cleared = api.request("PATCH", path, {"auth": None}).json()
    assert cleared["auth"] is None
    assert db.execute("SELECT egress_revision FROM destinations").fetchone()[0] is None
    # Only a private CA: no client certificate.
    only_ca = api.request("PATCH", path, {"tls": {"ca_bundle": ca.cert_pem.bytes().decode()}})
    assert only_ca.json()["tls"] == {"client_cert_sha256": None, "client_key_set": False,
                                     "ca_bundle_sha256": [_sha256(ca.cert_pem.bytes())]}
    plain = make_destination(api)
    assert (plain["tls"], plain["proxy"], plain["auth"]) == (None, None, None)


def _bad_inputs(ca: trustme.CA, client: trustme.LeafCert) -> list[tuple[dict, str]]:
    other = trustme.CA().issue_cert("other.example")
    good = tls_of(ca, client)
    return [
        ({"tls": {**good, "client_cert": "-----BEGIN CERTIFICATE-----\nnot base64!\n"
                  "-----END CERTIFICATE-----\n"}}, "tls.client_cert: not a PEM certificate"),
        ({"tls": {**good, "client_cert": "hello"}}, "tls.client_cert"),
        ({"tls": {**good, "client_key": other.private_key_pem.bytes().decode()}},
         "tls.client_key: does not match tls.client_cert"),
        ({"tls": {**good, "client_key": "-----BEGIN PRIVATE KEY-----\nAAAA\n"
                  "-----END PRIVATE KEY-----\n"}}, "tls.client_key: not a PEM private key"),
        ({"tls": {"client_cert": good["client_cert"]}}, "client_cert and client_key go together"),
        ({"tls": {**good, "ca_bundle": "garbage"}}, "tls.ca_bundle"),
        ({"tls": {}}, "tls"),
        ({"proxy": "socks5://127.0.0.1:1080"}, "proxy: the scheme must be http or https"),
        ({"proxy": "ftp://127.0.0.1:21"}, "proxy: the scheme must be http or https"),
        ({"proxy": "http://127.0.0.1:3128/path"}, "proxy: a proxy URL has no path"),
        ({"auth": {**AUTH, "client_secret": "x" * 4097}}, "client_secret"),
        ({"auth": {**AUTH, "type": "basic"}}, "auth.type"),
        ({"auth": {**AUTH, "token_url": "ftp://127.0.0.1/token"}}, "auth.token_url"),
    ]


def test_bad_egress_is_422_naming_the_field_and_writes_nothing(
    api: IngressProcess, db: psycopg.Connection, ca: trustme.CA, client: trustme.LeafCert
) -> None:
    existing = make_destination(api, proxy="http://127.0.0.1:3128")
    path = f"/v1/destinations/{existing['id']}"
    for fields, mentions in _bad_inputs(ca, client):
        answer = api.request("POST", "/v1/destinations", {"url": "http://127.0.0.1:9/", **fields})
        assert_error(answer, 422, mentions)
        assert count(db, "destinations") == 1
        assert_error(api.request("PATCH", path, fields), 422, mentions)
        kept = api.request("GET", path).json()
        assert (kept["proxy"], kept["tls"], kept["auth"]) == ("http://127.0.0.1:3128", None, None)


@pytest.fixture(scope="module")
def strict_api(module_dsn: str) -> Iterator[IngressProcess]:
    """An ingress process with the default target policy: private addresses refused."""
    with IngressProcess(module_dsn, allow_private_targets=False) as process:
        yield process


def test_refused_addresses_are_422(
    strict_api: IngressProcess, api: IngressProcess, db: psycopg.Connection
) -> None:
    url = {"url": "https://hooks.example.com/"}
    for fields, mentions in [
        ({"auth": {**AUTH, "token_url": "http://127.0.0.1/token"}}, "auth.token_url"),
        ({"auth": {**AUTH, "token_url": "http://169.254.169.254/token"}}, "auth.token_url"),
        ({"proxy": "http://10.0.0.1:3128"}, "proxy"),
        ({"proxy": "http://localhost:3128"}, "proxy"),
    ]:
        assert_error(strict_api.request("POST", "/v1/destinations", {**url, **fields}), 422,
                     mentions)
    assert count(db, "destinations") == 0


def test_openapi_documents_egress(api: IngressProcess) -> None:
    schemas = api.request("GET", "/openapi.json").json()["components"]["schemas"]
    for name in ("DestinationCreate", "DestinationPatch", "Destination"):
        assert {"tls", "proxy", "auth"} <= set(schemas[name]["properties"])
