"""OAuth bearer tokens on the hot path: fetched by a blocking credential library in a
thread, refreshed ahead of expiry in the background, never on every request.

Google's ``google-auth`` and Microsoft's ``azure-identity`` both hand out short-lived access
tokens (an hour, typically) from a blocking call: a service-account JWT exchange, the
metadata server, a CLI, a managed identity endpoint.  :class:`BearerToken` wraps such a
call.  A request asks for the ``Authorization`` value: while the token has more than its
refresh margin left, that is a comparison of two floats; inside the margin one refresh
starts in the background and requests go on with the current token; only a token that has
(nearly) expired, or none yet, makes requests wait, all of them for the same refresh.
A store that gets a 401 calls :meth:`BearerToken.invalidate` and retries once with a new
token (a revoked or rotated one).  The token never reaches a repr or a message.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Container
from typing import TypeVar

from .._base._errors import AccessDenied

__all__ = ["REFRESH_MARGIN", "BearerToken", "TokenSource", "first_line", "with_token"]

T = TypeVar("T")

TokenSource = Callable[[], tuple[str, float]]
"""A blocking call that returns ``(access_token, expires_at)`` (Unix time) or raises
:class:`~asyncloader.AccessDenied` with a message a user can act on."""

REFRESH_MARGIN = 300.0
"""Refresh this long before expiry (or at half the lifetime of a shorter-lived token)."""
_MUST_WAIT = 10.0  # closer to expiry than this, a request waits for the new token
_RETRY_AFTER = 15.0  # after a failed background refresh


def first_line(exc: BaseException) -> str:
    """A credential library's error, first line only and short, for a message: google-auth's
    and azure-identity's name files, endpoints and what they tried, not secrets, but
    azure-identity's run to many lines."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _retrieved(task: asyncio.Task[None]) -> None:
    """A refresh nobody waited for (it ran behind a valid token): its error is seen by
    the next request that must wait, not reported as never retrieved."""
    if not task.cancelled():
        task.exception()


class BearerToken:
    """The ``Authorization: Bearer ...`` value for requests, from ``source``.

    Args:
        source: The blocking token call, run in a worker thread.
        what: Names the credential for messages ("Google Application Default Credentials").
        clock: Unix time (tests pass their own).
    """

    __slots__ = ("_clock", "_expires", "_header", "_refresh_at", "_refreshing", "_source", "what")

    def __init__(
        self, source: TokenSource, *, what: str, clock: Callable[[], float] = time.time
    ) -> None:
        self._source = source
        self._clock = clock
        self.what = what
        self._header = ""
        self._expires = 0.0
        self._refresh_at = 0.0
        self._refreshing: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"BearerToken({self.what!r}, token=***)"

    @property
    def refreshes_at(self) -> float:
        """Unix time when the next background refresh starts."""
        return self._refresh_at

    @property
    def current(self) -> str:
        """The header value while no refresh is due, else "" (then await :meth:`header`):
        the hot path's check, without a coroutine."""
        return self._header if self._clock() < self._refresh_at else ""

    async def header(self) -> str:
        """The value of the ``Authorization`` header.

        Raises:
            AccessDenied: no token could be had from the source.
        """
        now = self._clock()
        if now < self._refresh_at:
            return self._header
        task = self._refreshing
        if task is None or task.done():
            self._refreshing = task = asyncio.create_task(self._refresh())
            task.add_done_callback(_retrieved)
        if now < self._expires - _MUST_WAIT:
            return self._header  # the current one is still good; the refresh runs behind
        await asyncio.shield(task)  # every waiter for the one refresh; raises its error
        return self._header

    def invalidate(self) -> None:
        """The server refused the current token (401): fetch a new one before the next
        request."""
        self._refresh_at = self._expires = 0.0

    async def _refresh(self) -> None:
        try:
            token, expires = await asyncio.to_thread(self._source)
            if not token:
                raise AccessDenied(f"{self.what} gave an empty access token")
        except Exception as exc:
            now = self._clock()
            if now < self._expires - _MUST_WAIT:
                # A background refresh failed while the token still works: try again
                # shortly, and keep using it meanwhile (a waiter would have raised).
                self._refresh_at = min(now + _RETRY_AFTER, self._expires - _MUST_WAIT)
                return
            if isinstance(exc, AccessDenied):
                raise
            raise AccessDenied(
                f"could not get an access token from {self.what}: {type(exc).__name__}"
            ) from exc
        now = self._clock()
        lifetime = max(0.0, expires - now)
        self._header = f"Bearer {token}"
        self._expires = expires
        self._refresh_at = expires - min(REFRESH_MARGIN, lifetime / 2)

    async def close(self) -> None:
        """Cancel a refresh in flight."""
        task, self._refreshing = self._refreshing, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def with_token(
    token: BearerToken | None,
    call: Callable[[str], Awaitable[T]],
    *,
    refused: Container[int] = (401,),
) -> T:
    """``call(authorization)`` with the token's header value ("" without a token).  An
    answer whose status is in ``refused`` (the token was revoked or rotated) gets one more
    try with a new token."""
    if token is None:
        return await call("")
    try:
        return await call(token.current or await token.header())
    except AccessDenied as exc:
        if exc.status not in refused:
            raise
        token.invalidate()
        return await call(await token.header())
