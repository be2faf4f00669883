"""Google Cloud credentials, the Google way: ``google-auth``'s Application Default
Credentials (``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's user credentials, the metadata
server of a Google VM), or a credentials file or object given.  Only the token source lives
here; tokens are cached and refreshed by :class:`._bearer.BearerToken`.

``google-auth`` is imported when a token is first needed (the ``gcs`` extra): anonymous
access to public buckets and emulators needs nothing but the package.
"""

from __future__ import annotations

import calendar
import os
import time
from typing import Any

from .._base._errors import AccessDenied
from ._bearer import TokenSource, first_line

__all__ = ["READ_ONLY_SCOPE", "READ_WRITE_SCOPE", "emulator_host", "google_token_source"]

# Reads (list, stat, get) ask for a token that can only read; writes (put: manifests) for
# one that may write too, only when something is written.
READ_ONLY_SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"
READ_WRITE_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
# A token whose expiry google-auth does not state is taken to live this long [seconds].
_UNSTATED = 3600.0
_NEED = "Google Cloud credentials need google-auth: pip install 'asyncloader[gcs]'"


def emulator_host() -> str | None:
    """``STORAGE_EMULATOR_HOST`` as a base URL (``http://`` added when it names no scheme),
    the variable every Google storage client honours; None when unset."""
    host = os.environ.get("STORAGE_EMULATOR_HOST", "").strip()
    if not host:
        return None
    return (host if "://" in host else f"http://{host}").rstrip("/")


def google_token_source(
    credentials: Any = None,
    credentials_file: str | None = None,
    *,
    scope: str = READ_ONLY_SCOPE,
) -> tuple[TokenSource, str]:
    """A blocking token call for :class:`._bearer.BearerToken`, and words naming the
    credentials.  ``credentials``: a ``google.auth.credentials.Credentials``; else
    ``credentials_file`` (a service-account key or any file ADC reads); else Application
    Default Credentials.  ``scope``: what the token may do (credentials given as an
    object keep the scopes they were made with, unless they require some).

    Raises:
        AccessDenied: google-auth is missing, or no credentials were found (the message
            says where they were looked for).
    """
    try:
        import google.auth
        import google.auth.exceptions
        from google.auth.transport.requests import Request
    except ImportError as exc:
        raise AccessDenied(_NEED) from exc
    scopes = [scope]
    try:
        if credentials is not None:
            creds, what = credentials, f"the given {type(credentials).__name__}"
        elif credentials_file is not None:
            creds = _from_file(credentials_file, scopes)
            what = f"the credentials file {credentials_file}"
        else:
            creds, _ = google.auth.default(scopes=scopes)
            what = "Google Application Default Credentials"
    except google.auth.exceptions.DefaultCredentialsError as exc:
        raise AccessDenied(
            "no Google Cloud credentials: set GOOGLE_APPLICATION_CREDENTIALS to a key file, "
            "run `gcloud auth application-default login`, run on a Google VM, or pass "
            f"anonymous=True for a public bucket ({first_line(exc)})"
        ) from None
    if getattr(creds, "requires_scopes", False):
        creds = creds.with_scopes(scopes)
    request = Request()

    def fetch() -> tuple[str, float]:
        try:
            creds.refresh(request)
        except google.auth.exceptions.GoogleAuthError as exc:
            raise AccessDenied(
                f"could not get an access token from {what}: {first_line(exc)}"
            ) from None
        expiry = getattr(creds, "expiry", None)  # naive UTC, or None: no stated expiry
        expires = calendar.timegm(expiry.utctimetuple()) if expiry else time.time() + _UNSTATED
        return str(creds.token), float(expires)

    return fetch, what


def _from_file(path: str, scopes: list[str]) -> Any:
    """A service-account key or a user's authorized-user file (the two kinds a user hands
    over as a file; ADC, through GOOGLE_APPLICATION_CREDENTIALS, reads every kind)."""
    import json

    from google.oauth2 import credentials as user
    from google.oauth2 import service_account

    try:
        with open(path) as f:
            kind = json.load(f).get("type")
    except (OSError, ValueError, AttributeError) as exc:
        raise AccessDenied(f"cannot read the credentials file {path}: {exc}") from None
    if kind == "service_account":
        return service_account.Credentials.from_service_account_file(path, scopes=scopes)  # type: ignore[no-untyped-call]
    if kind == "authorized_user":
        return user.Credentials.from_authorized_user_file(path, scopes=scopes)  # type: ignore[no-untyped-call]
    raise AccessDenied(
        f"the credentials file {path} is of type {kind!r}: pass service-account or "
        "authorized-user files here, or name other kinds in GOOGLE_APPLICATION_CREDENTIALS"
    )
