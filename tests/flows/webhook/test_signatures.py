"""flows/webhook/signatures.py: the HMAC scheme, clock tolerance, rotation, bearer tokens."""
from __future__ import annotations

import hashlib
import hmac

import pytest

from flows.webhook.signatures import SignatureError, parse_header, sign, verify, verify_bearer

BODY = b'{"paths": ["s3://flywheel/landing/a.jsonl"]}'


def test_sign_is_hmac_sha256_of_timestamp_dot_body():
    expected = hmac.new(b"k" * 16, b"1700000000." + BODY, hashlib.sha256).hexdigest()
    assert sign("k" * 16, 1700000000, BODY) == f"t=1700000000,v1={expected}"


def test_any_current_secret_and_any_v1_entry_is_accepted():
    header = sign("new" * 6, 1000, BODY) + ",v1=" + "0" * 64
    assert verify(header, BODY, ["old" * 6, "new" * 6], now=1000, tolerance_s=300) == 1000


@pytest.mark.parametrize("header, now, reason", [
    (None, 1000, "missing"),
    ("v1=ab", 1000, "must look like"),
    ("t=abc,v1=ab", 1000, "unix seconds"),
    ("t=\u00b2,v1=ab", 1000, "unix seconds"),  # "²".isdigit() is True
    ("t=" + "9" * 400 + ",v1=ab", 1000, "unix seconds"),  # no float holds it
    (sign("s" * 16, 1000, BODY), 1301, "outside"),
    (sign("s" * 16, 1000, BODY), 699, "outside"),
    (sign("s" * 16, 1000, BODY + b" "), 1000, "does not match"),
    (sign("other-secret-000", 1000, BODY), 1000, "does not match"),
])
def test_rejections_say_why(header, now, reason):
    with pytest.raises(SignatureError, match=reason):
        verify(header, BODY, ["s" * 16], now=now, tolerance_s=300)


def test_the_tolerance_edge_is_inclusive():
    assert verify(sign("s" * 16, 1000, BODY), BODY, ["s" * 16], now=1300, tolerance_s=300) == 1000


def test_parse_header_tolerates_spaces_and_case():
    assert parse_header(" t=5 , v1=ABCD ") == (5, ["abcd"])


def test_bearer_tokens():
    assert verify_bearer("Bearer tok-0123456789abcdef", ["x", "tok-0123456789abcdef"])
    assert verify_bearer("bearer tok-0123456789abcdef", ["tok-0123456789abcdef"])
    assert not verify_bearer("Bearer tok-0123456789abcde", ["tok-0123456789abcdef"])
    assert not verify_bearer("Basic tok-0123456789abcdef", ["tok-0123456789abcdef"])
    assert not verify_bearer("Bearer anything", [])
