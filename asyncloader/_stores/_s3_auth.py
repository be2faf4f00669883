"""A lean AWS Signature Version 4 signer for the hot GET path.

botocore's per-request machinery (event hooks, request object, user agent, response parsing)
costs several times the CPU of the HTTP request itself.  For a plain S3 GET only a handful of
headers need signing, the signing key changes once a day, and the timestamp once a second, so
signing is two SHA-256 and one HMAC per request.  Verified against botocore's ``S3SigV4Auth``
in the tests.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass
from urllib.parse import quote

__all__ = ["UNSIGNED_PAYLOAD", "FrozenCredentials", "SigV4Signer", "uri_encode_path"]

UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"


@dataclass(frozen=True, slots=True)
class FrozenCredentials:
    """Access key, secret and optional session token; the repr hides the secrets."""

    access_key: str
    secret_key: str
    token: str | None = None

    def __repr__(self) -> str:
        return f"FrozenCredentials(access_key={self.access_key[:4]}…, secret_key=***)"


def uri_encode_path(path: str) -> str:
    """Percent-encode an S3 object path the way SigV4 canonicalises it ('/' kept)."""
    return quote(path, safe="/~")


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


class SigV4Signer:
    """Signs GET/HEAD requests for one service and region with a cached signing key."""

    __slots__ = ("_creds", "_date_cache", "_key_cache", "region", "request_payer", "service")

    def __init__(
        self,
        creds: FrozenCredentials,
        region: str,
        service: str = "s3",
        *,
        request_payer: bool = False,
    ) -> None:
        self._creds = creds
        self.region = region
        self.service = service
        # Requester pays: every request says so (``x-amz-request-payer: requester``, signed).
        self.request_payer = request_payer
        self._key_cache: tuple[str, bytes] = ("", b"")
        self._date_cache: tuple[int, str] = (-1, "")

    def __repr__(self) -> str:
        return f"SigV4Signer(region={self.region!r}, service={self.service!r})"

    def in_region(self, region: str) -> SigV4Signer:
        """A signer with the same credentials for ``region``."""
        return SigV4Signer(self._creds, region, self.service, request_payer=self.request_payer)

    def set_credentials(self, creds: FrozenCredentials) -> None:
        if creds != self._creds:
            self._creds = creds
            self._key_cache = ("", b"")

    def _amz_date(self, now: float | None) -> str:
        sec = int(time.time() if now is None else now)
        cached_sec, cached = self._date_cache
        if sec != cached_sec:
            cached = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(sec))
            self._date_cache = (sec, cached)
        return cached

    def _signing_key(self, day: str) -> bytes:
        cached_day, key = self._key_cache
        if cached_day != day:
            k = _hmac(("AWS4" + self._creds.secret_key).encode(), day)
            k = _hmac(k, self.region)
            k = _hmac(k, self.service)
            key = _hmac(k, "aws4_request")
            self._key_cache = (day, key)
        return key

    def sign(
        self,
        method: str,
        host: str,
        encoded_path: str,
        query: str = "",
        now: float | None = None,
        payload_hash: str = UNSIGNED_PAYLOAD,
    ) -> dict[str, str]:
        """Return the headers that authenticate the request.

        Args:
            method: ``GET`` or ``HEAD``.
            host: The ``Host`` header value (``host[:port]``, port only if non-default).
            encoded_path: The already percent-encoded path, as sent on the wire.
            query: The canonical (sorted, encoded) query string; ``""`` for none.
            now: Unix time to sign at (tests); default now [seconds].
            payload_hash: Hex SHA-256 of the body, or ``UNSIGNED-PAYLOAD`` (GETs have none).
        """
        amz_date = self._amz_date(now)
        day = amz_date[:8]
        token = self._creds.token
        # Signed headers in name order: host, x-amz-content-sha256, x-amz-date, then
        # x-amz-request-payer and x-amz-security-token where sent.
        canonical_headers = (
            f"host:{host}\nx-amz-content-sha256:{payload_hash}\nx-amz-date:{amz_date}\n"
        )
        signed = "host;x-amz-content-sha256;x-amz-date"
        if self.request_payer:
            canonical_headers += "x-amz-request-payer:requester\n"
            signed += ";x-amz-request-payer"
        if token:
            # Canonical header values are trimmed, inner runs of spaces collapsed (SigV4).
            canonical_headers += f"x-amz-security-token:{' '.join(token.split())}\n"
            signed += ";x-amz-security-token"
        canonical = (
            f"{method}\n{encoded_path}\n{query}\n{canonical_headers}\n{signed}\n{payload_hash}"
        )
        scope = f"{day}/{self.region}/{self.service}/aws4_request"
        to_sign = (
            f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n"
            f"{hashlib.sha256(canonical.encode()).hexdigest()}"
        )
        signature = hmac.new(self._signing_key(day), to_sign.encode(), hashlib.sha256).hexdigest()
        headers = {
            "x-amz-date": amz_date,
            "x-amz-content-sha256": payload_hash,
            "Authorization": (
                f"AWS4-HMAC-SHA256 Credential={self._creds.access_key}/{scope}, "
                f"SignedHeaders={signed}, Signature={signature}"
            ),
        }
        if self.request_payer:
            headers["x-amz-request-payer"] = "requester"
        if token:
            headers["x-amz-security-token"] = token
        return headers
