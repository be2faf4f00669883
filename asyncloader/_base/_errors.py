"""The exception tree of asyncloader.

Every error the library raises on purpose is an :class:`AsyncLoaderError`::

    AsyncLoaderError
    ├── ClosedError               the loader was closed by its owner ("you closed it")
    ├── PipelineDeadError         a background part died ("it broke"); the cause is chained
    ├── BatchesHeldError          every ring slot is held by batches the consumer still keeps
    ├── ListingMismatchError      the ranks of a job hold different object lists for one URL
    ├── CacheFormatError          a cache folder's index is laid out unlike what this version writes
    ├── StoreError                anything the object store answered or failed to answer
    │   ├── ObjectNotFound        404 / no such key (per sample)
    │   ├── AccessDenied          403 / bad credentials (names bucket, never the secret)
    │   ├── Throttled             503 SlowDown, 429 (retried; raised when retries run out)
    │   ├── TransientStoreError   5xx, resets, time-outs, truncated bodies (retried likewise)
    │   └── IntegrityError        length or ETag mismatch: object truncated or changed mid-read
    │       └── LengthMismatch    an answer of the wrong length (retried: cut short on the way)
    ├── DecodeError               corrupt image, decompression bomb, bad decode hook output
    └── FailureBudgetExceeded     (also an ExceptionGroup) more per-sample failures than allowed

Per-sample errors carry the object's key in their message.  Errors are raised ``from`` the
SDK or transport exception that caused them, mapped in one place per backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

__all__ = [
    "first_keys",
    "AccessDenied",
    "AsyncLoaderError",
    "BatchesHeldError",
    "CacheFormatError",
    "ClosedError",
    "DecodeError",
    "FailureBudgetExceeded",
    "IntegrityError",
    "LengthMismatch",
    "ListingMismatchError",
    "ObjectNotFound",
    "not_listed",
    "PipelineDeadError",
    "StoreError",
    "Throttled",
    "TransientStoreError",
    "shown_key",
]


def first_keys(keys: Sequence[str], n: int) -> str:
    """The first ``n`` of ``keys`` (as messages show them), and how many more."""
    more = len(keys) - n
    return ", ".join(keys[:n]) + (f" and {more} more" if more > 0 else "")


def shown_key(key: str) -> str:
    """A key as messages, notes, reports and logs show it.

    A key that is an absolute URL (an HTTP manifest naming presigned URLs, the usual way to
    share a private bucket) carries its credentials in the query string — signature,
    credential, security token — and maybe in user info: both are hidden, the object stays
    named by its scheme, host and path.  Plain keys are shown as they are (``?`` may be part
    of an object's name).
    """
    if "://" not in key:
        return key
    try:
        parts = urlsplit(key)
    except ValueError:
        return key.split("?", 1)[0].split("#", 1)[0] + " [query hidden]"
    host = parts.netloc.rsplit("@", 1)[-1]
    query = "?[query hidden]" if parts.query or "?" in key else ""
    return f"{parts.scheme}://{host}{parts.path}{query}"


class AsyncLoaderError(Exception):
    """Base class of every error asyncloader raises on purpose."""


class ClosedError(AsyncLoaderError):
    """The loader (or store) was closed by its owner and cannot be used any more."""


class PipelineDeadError(AsyncLoaderError):
    """A background stage (event loop thread, decode worker pool) died unexpectedly."""


class BatchesHeldError(AsyncLoaderError):
    """The consumer keeps a reference to a batch in every ring slot: none can be made.

    A batch is a view of its slot and keeps it until the last reference to it is gone.
    Copy what you keep (``images.clone()``), drop batches you are done with, or give the
    loader more slots (``prefetch_batches``).
    """


class ListingMismatchError(AsyncLoaderError):
    """The ranks of a job hold different object lists for one URL: sharding them would read
    some samples twice and others never.  Raised on every rank before its first batch (or,
    on a rank already running when another refused, at its next batch)."""


class CacheFormatError(AsyncLoaderError):
    """A cache folder's index is not laid out as this version of asyncloader (and the
    diskcache it was written against) expects: it is refused rather than written into."""


class StoreError(AsyncLoaderError):
    """An object store request failed.

    Attributes:
        key: The object key (or listing prefix) the request was about, if any.
        status: The HTTP status, if the store answered.
    """

    def __init__(self, message: str, *, key: str | None = None, status: int | None = None):
        super().__init__(message)
        self.key = key
        self.status = status

    def __reduce__(self) -> tuple[object, ...]:
        # Keep key/status, and what subclasses add, across pickling (errors travel back
        # from worker processes).
        rebuild = (type(self), str(self), self.key, self.status)
        return (_rebuild_store_error, rebuild, dict(self.__dict__))


def _rebuild_store_error(
    cls: type[StoreError], message: str, key: str | None, status: int | None
) -> StoreError:
    return cls(message, key=key, status=status)


class WrongRegion(StoreError):
    """S3 answered that the bucket is in another region than the one requests were signed
    for (``301 PermanentRedirect``, ``400 AuthorizationHeaderMalformed``, or a HEAD's 301 or
    400 with ``x-amz-bucket-region``).  The S3 store moves to ``region`` and asks again;
    users see this only where the answer named no region.

    Attributes:
        region: The bucket's region as the answer named it ("" if it did not).
    """

    def __init__(
        self, message: str, *, key: str | None = None, status: int | None = None, region: str = ""
    ):
        super().__init__(message, key=key, status=status)
        self.region = region


class ObjectNotFound(StoreError):
    """The object (or bucket/container) does not exist."""


def not_listed(url: str, key: str) -> ObjectNotFound:
    """The error of an object a metadata file or manifest names and the store's listing
    lacks (listed with size -1): missing as surely as a 404 would say, and reported so
    without asking the store, which may not be there (a run from a warm cache, offline)."""
    return ObjectNotFound(
        f"not found: {url}{shown_key(key)} (named by the dataset's metadata file or "
        "manifest; the store's listing has no such object)",
        key=key,
    )


class AccessDenied(StoreError):
    """The store refused the credentials or the request (403, bad signature, ...)."""


class Throttled(StoreError):
    """The store asked us to slow down (503 SlowDown, 429); raised once retries ran out.

    Attributes:
        retry_after: The wait the answer asked for (``Retry-After``, Azure's
            ``x-ms-retry-after-ms``) [seconds], or None.
    """

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        status: int | None = None,
        retry_after: float | None = None,
    ):
        super().__init__(message, key=key, status=status)
        self.retry_after = retry_after


class TransientStoreError(StoreError):
    """A 5xx answer, reset connection, time-out or truncated body; raised once retries ran out."""


class IntegrityError(StoreError):
    """The bytes received do not match the listed length or ETag (truncated or replaced)."""


class LengthMismatch(IntegrityError):
    """A complete answer whose length differs from the listed or requested one.

    Usually cut short on the way (a middlebox that rewrote Content-Length): retried like a
    transient error.  One that persists after the retries (the object changed size without
    a new ETag, a stale listing) is a failure under ``on_error``.
    """


class DecodeError(AsyncLoaderError):
    """An object could not be turned into an image: corrupt data, decompression bomb, ...

    Attributes:
        key: The object key.
    """

    def __init__(self, message: str, *, key: str | None = None):
        super().__init__(message)
        self.key = key

    def __reduce__(self) -> tuple[object, ...]:
        # Notes (stage, key) travel too: errors come back from worker and engine processes.
        return (type(self), (str(self),), dict(self.__dict__))


class FailureBudgetExceeded(AsyncLoaderError, ExceptionGroup):  # type: ignore[misc]
    """More per-sample failures than ``max_failures`` allowed; every failure is attached.

    It is an :class:`ExceptionGroup` of the individual failures (each with a note naming its
    stage and key), so ``except* ObjectNotFound`` works on it.
    """

    def __new__(
        cls, message: str, exceptions: list[Exception]
    ) -> FailureBudgetExceeded:  # pragma: no cover - trivial
        return super().__new__(cls, message, exceptions)

    def derive(self, excs: list[Exception]) -> FailureBudgetExceeded:  # type: ignore[override]
        return FailureBudgetExceeded(self.message, excs)

    @classmethod
    def of(
        cls, failures: list[Exception], epoch: int, samples: int | None, max_failures: float
    ) -> FailureBudgetExceeded:
        """The error for ``failures`` in ``epoch`` (of ``samples``): how many failed of how
        many, the rule, the first keys, and what to do."""
        of = f" of the {samples} samples" if samples is not None else ""
        keys = sorted(shown_key(k) for k in (getattr(e, "key", None) for e in failures) if k)
        named = first_keys(keys, 5)
        return cls(
            f"{len(failures)}{of} of epoch {epoch} failed, more than "
            f"ErrorConfig(max_failures={max_failures}) allows (a count, or below 1 a fraction "
            f"of the epoch's samples; the default 0.01 is 1 %): {named}. Raise "
            "ErrorConfig(max_failures=) to skip more, or fix or remove those objects",
            list(failures),
        )


# The public classes are the package's: a traceback's last line reads
# ``asyncloader.ObjectNotFound: ...``, as the user imports and catches it (and it pickles
# by that name: ``asyncloader`` resolves it on first use).
for _public in (
    AccessDenied,
    AsyncLoaderError,
    BatchesHeldError,
    CacheFormatError,
    ClosedError,
    DecodeError,
    FailureBudgetExceeded,
    IntegrityError,
    LengthMismatch,
    ListingMismatchError,
    ObjectNotFound,
    PipelineDeadError,
    StoreError,
    Throttled,
    TransientStoreError,
):
    _public.__module__ = "asyncloader"
