"""Azure Blob credentials and request signing: where the account is, and how requests prove
who sends them (SharedKey: one HMAC-SHA256 over the canonical request; a SAS token on the
URL; a Microsoft Entra ID bearer token from ``azure-identity``; or nothing for public
containers).  Secrets never reach a repr or a message."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._base._errors import AccessDenied
from ._bearer import TokenSource, first_line

__all__ = [
    "AZURITE_ACCOUNT",
    "AZURITE_KEY",
    "STORAGE_SCOPE",
    "AzureCredentials",
    "SharedKeySigner",
    "entra_token_source",
    "parse_connection_string",
]

STORAGE_SCOPE = "https://storage.azure.com/.default"

# The storage emulator's published development account (not a secret).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
# The standard headers SharedKey signs, in order, before the x-ms-* headers.
_SIGNED_STANDARD = (
    "content-encoding",
    "content-language",
    "content-length",
    "content-md5",
    "content-type",
    "date",
    "if-modified-since",
    "if-match",
    "if-none-match",
    "if-unmodified-since",
    "range",
)


class SharedKeySigner:
    """Signs Blob REST requests with an account key (Azure's "Shared Key" scheme).

    The key is decoded once; signing is one HMAC-SHA256 over the canonical request.  The
    repr shows the account only.
    """

    __slots__ = ("_key", "account")

    def __init__(self, account: str, key: str) -> None:
        self.account = account
        try:
            self._key = base64.b64decode(key, validate=True)
        except (binascii.Error, ValueError):
            raise AccessDenied(
                f"the account key for Azure storage account {account!r} is not valid base64"
            ) from None

    def __repr__(self) -> str:
        return f"SharedKeySigner(account={self.account!r}, key=***)"

    def sign(
        self,
        method: str,
        path: str,
        query: Mapping[str, str],
        headers: dict[str, str],
    ) -> None:
        """Add ``Authorization`` to ``headers`` (lower-case names; ``x-ms-date`` set).

        Args:
            path: The request's URL path, percent-encoded as sent.
            query: The decoded query parameters.
        """
        parts = [method]
        for name in _SIGNED_STANDARD:
            value = headers.get(name, "")
            parts.append("" if name == "content-length" and value == "0" else value)
        canonical_headers = "".join(
            f"{k}:{headers[k].strip()}\n" for k in sorted(headers) if k.startswith("x-ms-")
        )
        resource = f"/{self.account}{path}" + "".join(
            f"\n{k.lower()}:{v}" for k, v in sorted(query.items(), key=lambda kv: kv[0].lower())
        )
        to_sign = "\n".join(parts) + "\n" + canonical_headers + resource
        digest = hmac.new(self._key, to_sign.encode(), hashlib.sha256).digest()
        headers["authorization"] = f"SharedKey {self.account}:{base64.b64encode(digest).decode()}"


def parse_connection_string(text: str) -> dict[str, str]:
    """``Name=value;...`` → a dict with lower-case names (values may contain ``=``)."""
    out: dict[str, str] = {}
    for part in text.split(";"):
        name, sep, value = part.strip().partition("=")
        if sep:
            out[name.strip().lower()] = value.strip()
    if out.get("usedevelopmentstorage", "").lower() == "true":
        out.setdefault("accountname", AZURITE_ACCOUNT)
        out.setdefault("accountkey", AZURITE_KEY)
        out.setdefault("blobendpoint", f"http://127.0.0.1:10000/{AZURITE_ACCOUNT}")
    return out


@dataclass(frozen=True, slots=True)
class AzureCredentials:
    """Where and how to reach one storage account; the repr hides the key and token."""

    account: str
    endpoint: str  # https://ACCOUNT.blob.core.windows.net, or an emulator's base URL
    key: str | None = None
    sas: str | None = None  # the SAS token's query string, without '?'
    credential: Any = None  # Entra ID: a TokenCredential, or "default"

    def __repr__(self) -> str:
        how = (
            "Entra ID"
            if self.credential is not None
            else "shared key"
            if self.key
            else "SAS"
            if self.sas
            else "anonymous"
        )
        return f"AzureCredentials(account={self.account!r}, endpoint={self.endpoint!r}, {how})"

    @classmethod
    def resolve(
        cls,
        account: str | None = None,
        *,
        account_key: str | None = None,
        sas_token: str | None = None,
        connection_string: str | None = None,
        endpoint_url: str | None = None,
        anonymous: bool = False,
        credential: Any = None,
    ) -> AzureCredentials:
        """Resolve the account, endpoint and secret from arguments, then the environment.

        Microsoft Entra ID is used when ``credential`` is given (a TokenCredential, or
        ``"default"`` for ``DefaultAzureCredential``), or when no key or SAS is given as an
        argument and ``AZURE_STORAGE_AUTH_MODE=login`` (the Azure CLI's variable).

        Raises:
            AccessDenied: no account name anywhere.
        """
        env = os.environ
        explicit = account_key or sas_token or connection_string or anonymous
        login = env.get("AZURE_STORAGE_AUTH_MODE", "").lower() == "login"
        if credential is None and not explicit and login:
            credential = "default"
        explicit_secret = account_key or sas_token or anonymous or credential is not None
        cs_text = connection_string
        if cs_text is None and not explicit_secret:
            cs_text = env.get("AZURE_STORAGE_CONNECTION_STRING")
        cs = parse_connection_string(cs_text) if cs_text else {}
        if account and cs.get("accountname") and cs["accountname"] != account:
            cs = {}  # the environment's string is for another account
        name = account or cs.get("accountname") or env.get("AZURE_STORAGE_ACCOUNT")
        if not name:
            raise AccessDenied(
                "no Azure storage account: use az://ACCOUNT/CONTAINER/..., account=, "
                "a connection string or AZURE_STORAGE_ACCOUNT"
            )
        key = sas = None
        if not anonymous and credential is None:
            key = account_key or cs.get("accountkey")
            sas = sas_token or cs.get("sharedaccesssignature")
            if not (key or sas or connection_string):
                key = env.get("AZURE_STORAGE_KEY") or env.get("AZURE_STORAGE_ACCESS_KEY")
                sas = env.get("AZURE_STORAGE_SAS_TOKEN")
        endpoint = endpoint_url or cs.get("blobendpoint")
        if not endpoint:
            protocol = cs.get("defaultendpointsprotocol", "https")
            suffix = cs.get("endpointsuffix", "core.windows.net")
            endpoint = f"{protocol}://{name}.blob.{suffix}"
        if key:
            sas = None  # one way to authenticate: the key signs every request
        return cls(
            name, endpoint.rstrip("/"), key or None, (sas or "").lstrip("?") or None, credential
        )


def entra_token_source(credential: Any) -> tuple[TokenSource, str]:
    """A blocking token call for :class:`._bearer.BearerToken` from an ``azure-identity``
    credential (``"default"``: ``DefaultAzureCredential``: environment, workload identity,
    managed identity, Azure CLI, ...), and words naming it.

    Raises:
        AccessDenied: azure-identity is missing.
    """
    if isinstance(credential, str):
        if credential != "default":
            raise ValueError(
                f"credential must be a TokenCredential or 'default', not {credential!r}"
            )
        try:
            from azure.identity import DefaultAzureCredential
        except ImportError as exc:
            raise AccessDenied(
                "Microsoft Entra ID needs azure-identity: pip install 'asyncloader[azure]'"
            ) from exc
        credential = DefaultAzureCredential()
    what = f"Microsoft Entra ID ({type(credential).__name__})"

    def fetch() -> tuple[str, float]:
        try:
            token = credential.get_token(STORAGE_SCOPE)
        except Exception as exc:  # azure-identity's ClientAuthenticationError and kin
            raise AccessDenied(f"could not get a token from {what}: {first_line(exc)}") from None
        return str(token.token), float(token.expires_on)

    return fetch, what
