"""A local OAuth token service on 127.0.0.1, for testing bearer-token credentials end to end
through the real credential libraries (test equipment).

* Google: the OAuth token endpoint a service-account key file names (``token_uri``).
  :meth:`TokenServer.google_service_account` writes such a key file (a fresh RSA key), so
  ``google-auth`` signs a JWT assertion and exchanges it here, exactly as with Google.
* Azure: an App Service managed-identity endpoint (``IDENTITY_ENDPOINT`` and
  ``IDENTITY_HEADER``, see :meth:`TokenServer.azure_managed_identity_env`), which
  ``azure-identity``'s ``ManagedIdentityCredential`` (and so ``DefaultAzureCredential``)
  asks.  Its tokens are JWTs with the claims Azurite's OAuth mode checks (issuer,
  audience, lifetime; Azurite does not check signatures).

Each token is new (Google's :meth:`TokenServer.google_token` ``(1)``, ``(2)``, ...; JWTs
numbered in their ``jti``, all carrying :data:`TOKEN_MARK`, so a test can grep for any
of them) and lives ``lifetime`` seconds, so tests see refreshes happen.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from ._equipment import Equipment

__all__ = ["TOKEN_MARK", "TokenServer"]

TOKEN_MARK = "asyncloaderTestAccessToken"
"""In every token handed out (an access token is a secret: tests grep logs and errors)."""
_TENANT = "72f988bf-0000-0000-0000-000000000000"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenServer(Equipment):
    """Hands out access tokens; counts them in ``issued``.

    Args:
        lifetime: Seconds each token is valid for.
    """

    def __init__(self, lifetime: float = 3600.0) -> None:
        self.lifetime = lifetime
        self.issued = 0
        self.handed_out: list[str] = []  # every token, for tests that grep for them
        self.scopes: dict[str, str] = {}  # Google token -> the scope it was asked for
        self.identity_header = "test-identity-header"
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.endpoint = ""

    def start(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, doc: dict[str, Any]) -> None:
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                form = urllib.parse.parse_qs(self.rfile.read(length).decode())
                if self.path != "/google/token" or "assertion" not in form:
                    self._answer(400, {"error": "invalid_request"})
                    return
                n = owner._next()
                owner.handed_out.append(owner.google_token(n))
                # The JWT assertion's claims name the scope the token is asked for.
                claims = form["assertion"][0].split(".")[1]
                claims += "=" * (-len(claims) % 4)
                scope = json.loads(base64.urlsafe_b64decode(claims)).get("scope", "")
                owner.scopes[owner.google_token(n)] = scope
                self._answer(
                    200,
                    {
                        "access_token": owner.google_token(n),
                        "expires_in": int(owner.lifetime),
                        "token_type": "Bearer",
                    },
                )

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query)
                if url.path != "/azure/msi":
                    self._answer(404, {"error": "not found"})
                    return
                if self.headers.get("X-IDENTITY-HEADER") != owner.identity_header:
                    self._answer(401, {"error": "wrong identity header"})
                    return
                resource = (query.get("resource") or [""])[0]
                now = int(time.time())
                expires = now + int(owner.lifetime)
                n = owner._next()
                claims = {
                    "aud": resource.rstrip("/"),
                    "iss": f"https://sts.windows.net/{_TENANT}/",
                    "iat": now - 5,
                    "nbf": now - 5,
                    "exp": expires,
                    "jti": f"{TOKEN_MARK}-{n}",
                }
                token = ".".join(
                    (
                        _b64(json.dumps({"alg": "RS256", "typ": "JWT"}).encode()),
                        _b64(json.dumps(claims).encode()),
                        _b64(b"unsigned"),
                    )
                )
                owner.handed_out.append(token)
                self._answer(
                    200,
                    {
                        "access_token": token,
                        "expires_on": str(expires),
                        "resource": resource,
                        "token_type": "Bearer",
                    },
                )

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="asyncloader-tokens", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    @staticmethod
    def google_token(n: int) -> str:
        """The ``n``-th Google access token this server hands out (from 1)."""
        return f"ya29.{TOKEN_MARK}-{n}"

    def _next(self) -> int:
        with self._lock:
            self.issued += 1
            return self.issued

    def google_service_account(self, path: str | Path) -> Path:
        """Write a service-account key file whose token endpoint is this server; return
        its path (for ``credentials_file=`` or ``GOOGLE_APPLICATION_CREDENTIALS``)."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
        doc = {
            "type": "service_account",
            "project_id": "asyncloader-test",
            "private_key_id": "test-key-1",
            "private_key": pem,
            "client_email": "loader@asyncloader-test.iam.gserviceaccount.com",
            "client_id": "1",
            "token_uri": f"{self.endpoint}/google/token",
        }
        out = Path(path)
        out.write_text(json.dumps(doc))
        return out

    def azure_managed_identity_env(self) -> dict[str, str]:
        """The environment of an App Service managed identity whose endpoint is this
        server."""
        return {
            "IDENTITY_ENDPOINT": f"{self.endpoint}/azure/msi",
            "IDENTITY_HEADER": self.identity_header,
        }
