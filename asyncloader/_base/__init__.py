"""The leaves every wing may use: the exception tree (``_errors``), value types, protocols and
stage messages (``_types``), validated settings and every default once (``_config``), the
process's environment (``_env``), counters and stats (``_stats``), manifest rows
(``_manifest``), leases on shared memory (``_lease``) and event loops on threads of their own
(``_own_thread``).  Nothing here imports another wing."""
