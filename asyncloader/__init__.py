"""asyncloader: stream folders of images from object stores straight into PyTorch batches.

The names below are imported on first use (PEP 562), so that a process that needs one part
(a decode worker: pixels, no stores, no event loop) does not pay for importing the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports

if TYPE_CHECKING:
    from ._bench import bench as bench
    from ._bench_report import BenchReport as BenchReport
    from ._cache import CacheStats as CacheStats
    from ._cache import ObjectCache as ObjectCache
    from ._config import IMAGENET_MEAN as IMAGENET_MEAN
    from ._config import IMAGENET_STD as IMAGENET_STD
    from ._config import FetchConfig as FetchConfig
    from ._config import RunConfig as RunConfig
    from ._describe import Inventory as Inventory
    from ._describe import describe as describe
    from ._describe import listing as listing
    from ._env import shard_from_env as shard_from_env
    from ._errors import AccessDenied as AccessDenied
    from ._errors import AsyncLoaderError as AsyncLoaderError
    from ._errors import BatchesHeldError as BatchesHeldError
    from ._errors import CacheFormatError as CacheFormatError
    from ._errors import ClosedError as ClosedError
    from ._errors import DecodeError as DecodeError
    from ._errors import FailureBudgetExceeded as FailureBudgetExceeded
    from ._errors import IntegrityError as IntegrityError
    from ._errors import LengthMismatch as LengthMismatch
    from ._errors import ListingMismatchError as ListingMismatchError
    from ._errors import ObjectNotFound as ObjectNotFound
    from ._errors import PipelineDeadError as PipelineDeadError
    from ._errors import StoreError as StoreError
    from ._errors import Throttled as Throttled
    from ._errors import TransientStoreError as TransientStoreError
    from ._loader import ImageLoader as ImageLoader
    from ._resume import merge_worker_states as merge_worker_states
    from ._stats import Stats as Stats
    from ._stores import AzureStore as AzureStore
    from ._stores import GCSStore as GCSStore
    from ._stores import HttpStore as HttpStore
    from ._stores import LocalStore as LocalStore
    from ._stores import S3Store as S3Store
    from ._stores import open_store as open_store
    from ._transforms import CenterCrop as CenterCrop
    from ._transforms import Plan as Plan
    from ._transforms import RandomResizedCrop as RandomResizedCrop
    from ._transforms import Resize as Resize
    from ._transforms import Transform as Transform
    from ._types import ObjectInfo as ObjectInfo
    from ._types import ObjectStore as ObjectStore
    from ._types import WritableStore as WritableStore
    from ._warm import WarmReport as WarmReport
    from ._warm import warm as warm

# name -> the module that defines it
_WHERE = {
    "BenchReport": "._bench_report",
    "bench": "._bench",
    "CacheStats": "._cache",
    "ObjectCache": "._cache",
    "IMAGENET_MEAN": "._config",
    "IMAGENET_STD": "._config",
    "FetchConfig": "._config",
    "RunConfig": "._config",
    "Inventory": "._describe",
    "describe": "._describe",
    "listing": "._describe",
    "shard_from_env": "._env",
    "AccessDenied": "._errors",
    "AsyncLoaderError": "._errors",
    "BatchesHeldError": "._errors",
    "CacheFormatError": "._errors",
    "ClosedError": "._errors",
    "DecodeError": "._errors",
    "FailureBudgetExceeded": "._errors",
    "IntegrityError": "._errors",
    "LengthMismatch": "._errors",
    "ListingMismatchError": "._errors",
    "ObjectNotFound": "._errors",
    "PipelineDeadError": "._errors",
    "StoreError": "._errors",
    "Throttled": "._errors",
    "TransientStoreError": "._errors",
    "ImageLoader": "._loader",
    "merge_worker_states": "._resume",
    "Stats": "._stats",
    "AzureStore": "._stores",
    "GCSStore": "._stores",
    "HttpStore": "._stores",
    "LocalStore": "._stores",
    "S3Store": "._stores",
    "open_store": "._stores",
    "CenterCrop": "._transforms",
    "Plan": "._transforms",
    "RandomResizedCrop": "._transforms",
    "Resize": "._transforms",
    "Transform": "._transforms",
    "ObjectInfo": "._types",
    "ObjectStore": "._types",
    "WritableStore": "._types",
    "WarmReport": "._warm",
    "warm": "._warm",
}

__version__ = "0.1.0"

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "AccessDenied",
    "AsyncLoaderError",
    "AzureStore",
    "BatchesHeldError",
    "CacheFormatError",
    "BenchReport",
    "CacheStats",
    "CenterCrop",
    "ClosedError",
    "DecodeError",
    "FailureBudgetExceeded",
    "FetchConfig",
    "GCSStore",
    "HttpStore",
    "ImageLoader",
    "IntegrityError",
    "Inventory",
    "LengthMismatch",
    "ListingMismatchError",
    "LocalStore",
    "ObjectInfo",
    "ObjectCache",
    "ObjectNotFound",
    "ObjectStore",
    "PipelineDeadError",
    "Plan",
    "RandomResizedCrop",
    "Resize",
    "RunConfig",
    "S3Store",
    "Stats",
    "StoreError",
    "Throttled",
    "Transform",
    "TransientStoreError",
    "WarmReport",
    "WritableStore",
    "__version__",
    "bench",
    "describe",
    "listing",
    "merge_worker_states",
    "open_store",
    "shard_from_env",
    "warm",
]


__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
