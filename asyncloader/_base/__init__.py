"""The leaves every wing may use: the exception tree (``_errors``), value types, protocols
and stage messages (``_types``), validated settings and every default once (``_config``),
the process's environment (``_env``), counters (``_stats``) and their snapshot
(``_snapshot``), what bounds a run (``_bound``) and the scalars a trainer plots of them
(``_scalars``), manifest rows
(``_manifest``), leases on shared memory (``_lease``) and event loops on threads of their
own (``_own_thread``).  Nothing here
imports another wing.

Also here: folders made for the owner or the group only (``_folders``), request latencies and
their quantiles (``_latency``), every start and stop bound named once (``_lifecycle``), the
processes below one and the CPU they spent (``_proctree``), shared memory (``_shm``: memfds
on Linux), one source of several (``_sources``), the CPUs each rank of a node is bound to
(``_binding``), the adaptive budget of requests in flight and their pace (``_budget``) with
the timer its paced requests wait on (``_timer``) and the file a node's budgets share
(``_node_share``), which samples ``filters=`` keeps
(``_filters``), aspect-ratio buckets (``_buckets``), EXIF orientation and turning an image
upright (``_orientation``), and where the job's key-value store is
and a client of it (``_jobstore``); a resume state loaded into ``ImageDataset``, in shared
memory on its way to the DataLoader workers (``_worker_resume``); and a DataLoader worker's
exit that waits for the batch its queue is still pickling (``_worker_exit``)."""
