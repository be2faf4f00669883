"""Batches out: the batch ring and its leases (``_ring``), what a batch becomes — device,
dtype, normalisation, layout (``_device_spec``) — and the uploader that copies and converts
it on its own CUDA streams (``_upload``).  Imports ``_base`` only."""
