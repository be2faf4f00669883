"""The flow on one event loop: epoch order and shards (``_sampler``), resume states
(``_resume``) and where the run stands (``_position``), the job's c10d store (``_dist``)
and the job's dataset as a rank counts it (``_job``), the batches an engine makes and a
bucketed run's shapes and crops (``_batches``), the cache fill on the way in
(``_cache_fill``) and the extras beside the images (``_extras``), the asyncio pipeline
(``_pipeline``) and what it announces, with the samples that fail (``_notices``), the
loop thread and teardown order (``_runtime``), and the composition root (``_build``).
Over every wing below it; the loader and its engine processes are ``_loader``'s."""
