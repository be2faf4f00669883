"""The shape the HTTP stores share (S3, GCS, Azure, plain HTTP): the client choice made once
(``http_client``: our lean HTTP/1.1 client, or aiohttp, which a proxy spoken to over TLS
always gets), the closed check, ``repr``; and for the stores that talk to one origin (GCS,
Azure), opening their clients on first use and closing them with their bearer tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._base._errors import ClosedError
from ._http import REQUESTS_CA_NAMES, ca_bundle_for, open_clients

if TYPE_CHECKING:
    import aiohttp

    from ._bearer import BearerToken
    from ._lean_http import LeanHTTPClient

__all__ = ["HTTPStoreBase", "OriginStore", "use_lean_client"]


def use_lean_client(http_client: str) -> bool:
    """Whether requests are to go through the lean client: ``http_client="lean"`` (the
    default).  Where an ``https://`` proxy is on the way, aiohttp takes them anyway
    (``open_clients``).

    Raises:
        ValueError: ``http_client`` is neither ``"lean"`` nor ``"aiohttp"``.
    """
    if http_client not in ("lean", "aiohttp"):
        raise ValueError(f"http_client must be 'lean' or 'aiohttp', not {http_client!r}")
    return http_client == "lean"


class HTTPStoreBase:
    """What every HTTP store has: a URL, a closed flag, and their ``repr``."""

    _closed: bool = False

    @property
    def url(self) -> str:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def _check_open(self) -> None:
        """Raises:
        ClosedError: the store was closed."""
        if self._closed:
            raise ClosedError(f"{self!r} is closed")


class OriginStore(HTTPStoreBase):
    """An HTTP store of one origin: one lean client (or one aiohttp session), opened on
    first use, and the bearer tokens it sends, closed with it."""

    _origin: str
    _use_lean: bool
    _max_connections: int
    _read_timeout: float
    _ca_bundle: str | None
    _proxy: str | None = None
    _session: aiohttp.ClientSession | None = None
    _lean: LeanHTTPClient | None = None

    def _init_origin(
        self,
        origin: str,
        *,
        http_client: str,
        max_connections: int,
        read_timeout: float,
        ca_bundle: str | None,
        proxy: str | None = None,
    ) -> None:
        """Set the origin (``scheme://host[:port]``) and how to reach it (``proxy``: a
        store option, else the environment's); opens nothing.

        Raises:
            ValueError: an unknown ``http_client``.
        """
        self._use_lean = use_lean_client(http_client)
        self._origin = origin
        self._max_connections = max_connections
        self._read_timeout = read_timeout
        self._ca_bundle = ca_bundle_for(ca_bundle, *REQUESTS_CA_NAMES)
        self._proxy = proxy
        self._session = None
        self._lean = None
        self._closed = False

    def _open_clients(self) -> bool:
        """Open the client if it is not open yet; whether it was opened now.

        Raises:
            ClosedError: the store was closed.
        """
        self._check_open()
        if self._lean is not None or self._session is not None:
            return False
        self._lean, self._session = open_clients(
            self._origin,
            lean=self._use_lean,
            max_connections=self._max_connections,
            read_timeout=self._read_timeout,
            ca_bundle=self._ca_bundle,
            proxy=self._proxy,
        )
        return True

    def _take_tokens(self) -> list[BearerToken | None]:
        """The bearer tokens to close with the store, dropped from it (none by default)."""
        return []

    async def close(self) -> None:
        """Close the client and the tokens; idempotent."""
        self._closed = True
        session, self._session = self._session, None
        lean, self._lean = self._lean, None
        tokens = self._take_tokens()
        if session is not None:
            await session.close()
        if lean is not None:
            await lean.close()
        for token in tokens:
            if token is not None:
                await token.close()
