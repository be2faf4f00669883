"""The loader's summary as a newcomer reads it: every line follows from the same counters,
so no two lines disagree (a verdict on the bound, the samples decoded against those
delivered), and nothing is printed half-empty."""

from __future__ import annotations

from collections import Counter

from asyncloader._base._stats import TELL_AFTER, Counters


def _counters(batches: int, *, decoded: int, delivered: int, **kw: object) -> Counters:
    c = Counters()
    c.consumer_batches = batches
    c.consumer_samples = delivered
    c.decoded = decoded
    c.decode_seconds = 0.0
    c.consumer_wait_seconds = 0.0  # the training loop never waited: consumer-bound
    for name, value in kw.items():
        setattr(c, name, value)
    return c


def test_a_short_run_has_one_verdict_everywhere() -> None:
    stats = _counters(TELL_AFTER - 1, decoded=400, delivered=300).snapshot(
        decode_workers=2, max_inflight=64
    )
    assert stats.bound == "unknown"
    assert "bound by: too short a run to tell" in stats.summary()
    assert stats.bound_in_words().startswith("too short a run to tell")
    long = _counters(TELL_AFTER, decoded=400, delivered=300).snapshot(
        decode_workers=2, max_inflight=64
    )
    assert long.bound == "consumer"
    assert "bound by: consumer" in long.summary()
    assert long.bound_in_words() == "the training loop: the loader kept ahead of it"


def test_samples_decoded_ahead_of_the_training_loop_are_said() -> None:
    stats = _counters(
        TELL_AFTER, decoded=528, delivered=398, skipped=Counter({"DecodeError": 2})
    ).snapshot(decode_workers=2, max_inflight=64)
    assert stats.samples_ahead == 128
    first = stats.summary().splitlines()[0]
    assert first.endswith("; 128 more decoded ahead of the training loop")
    exact = _counters(TELL_AFTER, decoded=400, delivered=400).snapshot(
        decode_workers=2, max_inflight=64
    )
    assert exact.samples_ahead == 0 and "ahead" not in exact.summary()


def test_counts_by_reason_read_whole() -> None:
    none = _counters(TELL_AFTER, decoded=1, delivered=1).snapshot(decode_workers=1, max_inflight=1)
    assert "retries 0, skipped 0" in none.summary()
    some = _counters(
        TELL_AFTER,
        decoded=1,
        delivered=1,
        retries=Counter({"throttled": 2, "transient": 1}),
        skipped=Counter({"DecodeError": 1}),
    ).snapshot(decode_workers=1, max_inflight=1)
    line = some.summary().splitlines()[-1]
    assert line.endswith("retries 3 (throttled 2, transient 1), skipped 1 (DecodeError 1)")
    assert " ," not in some.summary()


def test_a_run_waiting_on_the_cache_is_bound_by_the_cache_not_the_store() -> None:
    """Every sample from the SSD cache, no request, the loop waiting and decode idle: the
    disk kept it waiting, not the store (a cache-only run was called fetch-bound)."""
    c = _counters(TELL_AFTER, decoded=400, delivered=400, cache_hits=400)
    c.started -= 10.0
    c.consumer_wait_seconds = 5.0
    stats = c.snapshot(decode_workers=2, max_inflight=64)
    assert stats.requests == 0
    assert stats.bound == "cache"
    assert "bound by: cache" in stats.summary()
    assert stats.bound_in_words().startswith("reading the SSD cache")
    c.objects_fetched = 400  # the same wait with every sample fetched: the store
    assert c.snapshot(decode_workers=2, max_inflight=64).bound == "fetch"
