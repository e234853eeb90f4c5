import base64
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

import engine
from engine.webhooks.signing import build_headers, generate_secret, secret_key, sign


def header_dict(lines: list[str]) -> dict[str, str]:
    out = {}
    for line in lines:
        name, _, value = line.partition(":")
        out[name.strip().lower()] = value.strip()
    return out


def test_generate_secret_shape() -> None:
    secret = generate_secret()
    assert secret.startswith("whsec_")
    assert 24 <= len(base64.b64decode(secret[6:], validate=True)) <= 32
    assert generate_secret() != secret


def test_one_secret_verifies_with_standardwebhooks() -> None:
    secret = generate_secret()
    body = b'{"type":"order.created","payload":{"n":1}}'
    now = int(time.time())
    headers = header_dict(build_headers([secret], "evt_1", now, body))
    assert Webhook(secret).verify(body, headers) == {"type": "order.created", "payload": {"n": 1}}


def test_build_headers_lines() -> None:
    headers = header_dict(build_headers([generate_secret()], "42", 1700000000, b"{}"))
    assert headers["webhook-id"] == "42"
    assert headers["webhook-timestamp"] == "1700000000"
    assert headers["content-type"] == "application/json"
    assert headers["user-agent"] == f"engine/{engine.__version__}"
    assert headers["expect"] == ""


def test_rotation_each_secret_alone_verifies() -> None:
    old, new = generate_secret(), generate_secret()
    body = b'{"a":[1,2,3]}'
    headers = header_dict(build_headers([new, old], "evt_rot", int(time.time()), body))
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (old, new):
        Webhook(secret).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(generate_secret()).verify(body, headers)


def test_wrong_secret_fails() -> None:
    body = b"{}"
    headers = header_dict(build_headers([generate_secret()], "evt", int(time.time()), body))
    with pytest.raises(WebhookVerificationError):
        Webhook(generate_secret()).verify(body, headers)


def test_tampered_body_fails() -> None:
    secret = generate_secret()
    headers = header_dict(build_headers([secret], "evt", int(time.time()), b'{"x":1}'))
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(b'{"x":2}', headers)


@given(
    body=st.text().map(str.encode),
    msg_id=st.text(
        alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=64
    ),
)
def test_random_bodies_and_ids_verify(body: bytes, msg_id: str) -> None:
    secret = generate_secret()
    headers = header_dict(build_headers([secret], msg_id, int(time.time()), body))
    Webhook(secret).verify(body, headers, json_parse=False)


@given(key=st.binary(min_size=1, max_size=200), body=st.text(max_size=2048).map(str.encode))
def test_keys_of_any_length_verify(key: bytes, body: bytes) -> None:
    # Keys past SHA-256's 64-byte block are hashed first (RFC 2104): both branches.
    secret = "whsec_" + base64.b64encode(key).decode()
    headers = header_dict(build_headers([secret], "evt_7", int(time.time()), body))
    Webhook(secret).verify(body, headers, json_parse=False)


def test_known_vector() -> None:
    # The example vector from the Standard Webhooks / Svix documentation.
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    assert (
        sign([secret], "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body)
        == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    )


@pytest.mark.parametrize("bad", ["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_not*base64!", "whsec_"])
def test_bad_secret_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="secret"):
        secret_key(bad)
    with pytest.raises(ValueError):
        sign([bad], "id", 1, b"{}")
