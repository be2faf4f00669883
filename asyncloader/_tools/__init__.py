"""Features over the running parts: ``warm`` (``_warm``), ``ls`` and ``listing``
(``_describe``; what the metadata files hold, ``_columns``), ``bench`` and its report
(``_bench``, ``_bench_report``), ``bench``'s measurements on this machine
(``_bench_local``), and the command line's grammar (``_args``)."""
