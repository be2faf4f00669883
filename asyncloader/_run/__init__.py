"""The flow and its owner: epoch order and shards (``_sampler``), resume states
(``_resume``), the cache fill on the way in (``_cache_fill``), the asyncio pipeline
(``_pipeline``), the loop thread and teardown order (``_runtime``), the composition root
(``_build``), ``ImageLoader`` (``_loader``) and the job's c10d store (``_dist``).
Over every wing below it."""
