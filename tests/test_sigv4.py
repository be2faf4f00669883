"""The lean SigV4 signer against botocore's own signer (the oracle)."""

from __future__ import annotations

import calendar
import hashlib
import time

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncloader._stores._s3_auth import FrozenCredentials, SigV4Signer, uri_encode_path

EMPTY = hashlib.sha256(b"").hexdigest()
keys = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=40
).filter(lambda k: not k.startswith("/") and "//" not in k and "." not in k.split("/"))


@settings(max_examples=60, deadline=None)
@given(
    key=keys,
    token=st.one_of(st.none(), st.text(min_size=1, max_size=30).filter(str.isprintable)),
    payer=st.booleans(),
)
def test_signature_matches_botocore(key: str, token: str | None, payer: bool) -> None:
    host = "s3.eu-west-1.amazonaws.com"
    path = "/bucket/" + uri_encode_path(key)
    req = AWSRequest("GET", f"https://{host}{path}")
    if payer:  # boto3's RequestPayer="requester"
        req.headers["x-amz-request-payer"] = "requester"
    S3SigV4Auth(Credentials("AKIDEXAMPLE", "s3cr3t/KEY+x", token), "s3", "eu-west-1").add_auth(req)
    now = calendar.timegm(time.strptime(req.headers["X-Amz-Date"], "%Y%m%dT%H%M%SZ"))
    creds = FrozenCredentials("AKIDEXAMPLE", "s3cr3t/KEY+x", token)
    signer = SigV4Signer(creds, "eu-west-1", request_payer=payer)
    ours = signer.sign("GET", host, path, now=now, payload_hash=EMPTY)
    assert ours["Authorization"] == req.headers["Authorization"]
    assert ours.get("x-amz-request-payer") == ("requester" if payer else None)
    # Moving to another region keeps the rest.
    assert signer.in_region("us-west-2").request_payer is payer


def test_repr_hides_secrets() -> None:
    creds = FrozenCredentials("AKIDEXAMPLE", "supersecret", "tokentoken")
    signer = SigV4Signer(creds, "us-east-1")
    for text in (repr(creds), str(creds), repr(signer)):
        assert "supersecret" not in text
        assert "tokentoken" not in text


@settings(max_examples=30, deadline=None)
@given(key=keys, body=st.binary(max_size=2000))
def test_a_put_with_its_body_signed_matches_botocore(key: str, body: bytes) -> None:
    """A PUT (a published manifest) signs the SHA-256 of its body, as botocore does."""
    host = "s3.eu-west-1.amazonaws.com"
    path = "/bucket/" + uri_encode_path(key)
    digest = hashlib.sha256(body).hexdigest()
    req = AWSRequest("PUT", f"https://{host}{path}", data=body)
    req.headers["X-Amz-Content-SHA256"] = digest
    S3SigV4Auth(Credentials("AKIDEXAMPLE", "s3cr3t/KEY+x"), "s3", "eu-west-1").add_auth(req)
    now = calendar.timegm(time.strptime(req.headers["X-Amz-Date"], "%Y%m%dT%H%M%SZ"))
    signer = SigV4Signer(FrozenCredentials("AKIDEXAMPLE", "s3cr3t/KEY+x", None), "eu-west-1")
    ours = signer.sign("PUT", host, path, now=now, payload_hash=digest)
    assert ours["Authorization"] == req.headers["Authorization"]
