"""Features over the running parts: ``warm`` (``_warm``), ``ls`` and ``listing``
(``_describe``), ``bench`` and its report (``_bench``, ``_bench_report``)."""
