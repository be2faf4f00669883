"""The loader and where its engine runs, each module named by its side of the process
boundary.

The training process's side: ``ImageLoader`` (``_image_loader``), the sync consumer's waits
and deliveries (``_consumer``), what the loader asks of its engine (``_surface``), where the
engine goes (``_start``: engine processes, or this process), the engine processes as the
trainer supervises them (``_parent``), one engine process's link (``_link``) and the reader
thread of their sockets (``_reader``); the loader's health where trainers look, scalars
logged every N steps and the job's view over ranks (``_health``).  Both sides: the engine on
a loop thread of the process that holds it (``_local``: the trainer's in the inline mode,
each engine process's own otherwise), the typed messages and the errors that cross
(``_wire``), and how a child process starts (``_launch``).  The engine process's side: its
own main (``_child``).

The flow itself (order, pipeline, cache fill, runtime) is ``_run``'s: this wing places it
and speaks to it, and imports nothing above it.
"""
