"""asyncloader: stream folders of images from object stores straight into PyTorch batches.

The names below are imported on first use (PEP 562), so that a process that needs one part
(a decode worker: pixels, no stores, no event loop) does not pay for importing the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports

if TYPE_CHECKING:
    from ._base._buckets import Buckets as Buckets
    from ._base._buckets import make_buckets as make_buckets
    from ._base._config import IMAGENET_MEAN as IMAGENET_MEAN
    from ._base._config import IMAGENET_STD as IMAGENET_STD
    from ._base._config import CacheConfig as CacheConfig
    from ._base._config import DecodeConfig as DecodeConfig
    from ._base._config import EngineConfig as EngineConfig
    from ._base._config import ErrorConfig as ErrorConfig
    from ._base._config import FetchConfig as FetchConfig
    from ._base._config import OutputConfig as OutputConfig
    from ._base._config import ShardConfig as ShardConfig
    from ._base._config import StoreConfig as StoreConfig
    from ._base._env import shard_from_env as shard_from_env
    from ._base._errors import AccessDenied as AccessDenied
    from ._base._errors import AsyncLoaderError as AsyncLoaderError
    from ._base._errors import BatchesHeldError as BatchesHeldError
    from ._base._errors import CacheFormatError as CacheFormatError
    from ._base._errors import ClosedError as ClosedError
    from ._base._errors import DecodeError as DecodeError
    from ._base._errors import FailureBudgetExceeded as FailureBudgetExceeded
    from ._base._errors import IntegrityError as IntegrityError
    from ._base._errors import LengthMismatch as LengthMismatch
    from ._base._errors import ListingMismatchError as ListingMismatchError
    from ._base._errors import ObjectNotFound as ObjectNotFound
    from ._base._errors import PipelineDeadError as PipelineDeadError
    from ._base._errors import StoreError as StoreError
    from ._base._errors import Throttled as Throttled
    from ._base._errors import TransientStoreError as TransientStoreError
    from ._base._scalars import SCALARS as SCALARS
    from ._base._sources import Source as Source
    from ._base._stats import Stats as Stats
    from ._base._types import ObjectInfo as ObjectInfo
    from ._base._types import ObjectStore as ObjectStore
    from ._base._types import WritableStore as WritableStore
    from ._cache import CacheStats as CacheStats
    from ._cache import ObjectCache as ObjectCache
    from ._decode._transforms import CenterCrop as CenterCrop
    from ._decode._transforms import Plan as Plan
    from ._decode._transforms import RandomResizedCrop as RandomResizedCrop
    from ._decode._transforms import Resize as Resize
    from ._decode._transforms import Transform as Transform
    from ._loader._health import LoaderLogger as LoaderLogger
    from ._loader._health import job_scalars as job_scalars
    from ._loader._image_loader import ImageLoader as ImageLoader
    from ._loader._image_loader import LoaderOptions as LoaderOptions
    from ._run._resume import merge_worker_states as merge_worker_states
    from ._stores import AzureStore as AzureStore
    from ._stores import GCSStore as GCSStore
    from ._stores import HttpStore as HttpStore
    from ._stores import LocalStore as LocalStore
    from ._stores import S3Store as S3Store
    from ._stores import open_store as open_store
    from ._tools._bench import bench as bench
    from ._tools._bench_report import BenchReport as BenchReport
    from ._tools._describe import Inventory as Inventory
    from ._tools._describe import describe as describe
    from ._tools._describe import listing as listing
    from ._tools._warm import WarmReport as WarmReport
    from ._tools._warm import warm as warm

__version__ = "0.1.0"

__all__, __getattr__, __dir__ = lazy_exports(__name__, globals())
__all__ += ["__version__"]
