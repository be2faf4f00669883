"""The grouped configs: the loader's options moved into them, the old keywords still working
for a release (with a warning that names the new spelling), and every default resolved in
one place."""

from __future__ import annotations

import ast
import dataclasses
import warnings
from pathlib import Path
from typing import Any

import pytest

import asyncloader as al
from asyncloader._base import _config
from asyncloader._run._build import CONFIG_TYPES, MOVED, fold_moved
from asyncloader.testing import MemoryBucket, MemoryStore

from .conftest import N_IMAGES

PKG = Path(al.__file__).parent
# A value for each moved keyword that differs from its default.
EXAMPLES: dict[str, Any] = {
    "cache_size": "2GB",
    "cache_scaled_jpegs": True,
    "listing_max_age": 60.0,
    "refresh_listing": True,
    "local_world_size": 2,
    "worker": 1,
    "num_workers": 3,
    "even": "drop",
    "mean": (0.5, 0.5, 0.5),
    "std": None,
    "channels_last": True,
    "pin": "staging",
    "prefetch_batches": 7,
    "max_pixels": 1000,
    "event_loop": "uvloop",
}


@pytest.fixture(scope="module")
def bucket(jpeg_folder: Path) -> MemoryBucket:
    return MemoryBucket(
        {p.relative_to(jpeg_folder).as_posix(): p.read_bytes() for p in jpeg_folder.rglob("*.jpg")}
    )


def test_every_moved_keyword_lands_in_its_config_with_a_warning_naming_it() -> None:
    assert set(EXAMPLES) == set(MOVED)
    for old, value in EXAMPLES.items():
        name, field = MOVED[old]
        with pytest.warns(DeprecationWarning, match=f"ImageLoader\\({old}=") as caught:
            configs = fold_moved("ImageLoader", {old: value}, {})
        (w,) = caught
        text = str(w.message)
        kind = CONFIG_TYPES[name].__name__
        assert f"ImageLoader({old}=...)" in text and f"{name}={kind}({field}=...)" in text
        assert getattr(configs[name], field) == value
        # The other fields keep their defaults; the other configs are their defaults.
        assert configs[name] == dataclasses.replace(CONFIG_TYPES[name](), **{field: value})
        for other, cls in CONFIG_TYPES.items():
            if other != name:
                assert configs[other] == cls()


def test_an_old_keyword_goes_over_the_config_given_and_keeps_its_other_fields() -> None:
    given = al.CacheConfig(size="1GB", refresh_listing=True)
    with pytest.warns(DeprecationWarning, match="cache=CacheConfig"):
        configs = fold_moved("ImageLoader", {"cache_size": "3GB"}, {"cache": given})
    assert configs["cache"] == al.CacheConfig(size="3GB", refresh_listing=True)


def test_a_keyword_the_loader_never_had_is_a_type_error(bucket: MemoryBucket) -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'prefetch'"):
        al.ImageLoader(store=MemoryStore(bucket), prefetch=3)


def test_the_loader_runs_with_old_and_new_spellings_alike(bucket: MemoryBucket) -> None:
    common: dict[str, Any] = {
        "batch_size": 16,
        "decode_workers": 1,
        "decode_backend": "thread",
        "transform": al.RandomResizedCrop(32),
        "shuffle": False,
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = al.ImageLoader(store=MemoryStore(bucket), prefetch_batches=6, even="drop", **common)
    said = sorted(str(w.message).split(" is now ")[1] for w in caught)
    assert said == [
        "ImageLoader(engine=EngineConfig(prefetch_batches=...)); the old keyword goes in a "
        "future release",
        "ImageLoader(shard=ShardConfig(even=...)); the old keyword goes in a future release",
    ]
    assert all(w.category is DeprecationWarning for w in caught)
    new = al.ImageLoader(
        store=MemoryStore(bucket),
        engine=al.EngineConfig(prefetch_batches=6),
        shard=al.ShardConfig(even="drop"),
        **common,
    )
    with old, new:
        assert old.stats().ring_slots == new.stats().ring_slots == 6
        got = [[lab.tolist() for _, lab in loader] for loader in (old, new)]
    assert got[0] == got[1] and sum(map(len, got[0])) == N_IMAGES


def test_new_spellings_raise_no_warning(bucket: MemoryBucket, tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with al.ImageLoader(
            store=MemoryStore(bucket),
            batch_size=8,
            decode_backend="thread",
            transform=al.RandomResizedCrop(32),
            cache_dir=tmp_path / "c",
            cache=al.CacheConfig(size="1GB"),
            engine=al.EngineConfig(max_pixels=10**8),
        ) as loader:
            assert loader.cache is not None and loader.cache.size_limit == 10**9
            next(iter(loader))


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: al.EngineConfig(event_loop="trio"), "event_loop"),  # type: ignore[arg-type]
        (lambda: al.EngineConfig(prefetch_batches=0), "prefetch_batches"),
        (lambda: al.EngineConfig(max_pixels=0), "max_pixels"),
        (lambda: al.CacheConfig(listing_max_age=-1), "listing_max_age"),
    ],
)
def test_a_config_refuses_what_cannot_work(make: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


# Option names whose default is one of the config module's constants, wherever they are.
DEFAULTS = {
    "cache_size": "CACHE_SIZE",
    "size_limit": "CACHE_SIZE",
    "listing_max_age": "LISTING_MAX_AGE",
    "max_age": "LISTING_MAX_AGE",
    "max_pixels": "MAX_PIXELS",
    "read_timeout": "READ_TIMEOUT",
    "list_concurrency": "LIST_CONCURRENCY",
}


def _defaults(tree: ast.AST) -> list[tuple[str, ast.expr, int]]:
    """(name, default, line) of every parameter and class field default in ``tree``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            positional = a.posonlyargs + a.args
            pairs = list(
                zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True)
            )
            pairs += [
                (k, d) for k, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None
            ]
            out += [(arg.arg, d, node.lineno) for arg, d in pairs]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            out.append((node.target.id, node.value, node.lineno))
    return out


def test_every_default_is_written_once() -> None:
    """Each of these options defaults to the one constant of ``_base/_config.py``, never to
    a copy of its value (``"100GB"`` was written five times, ``3600`` seven)."""
    copies, uses = [], 0
    for path in PKG.rglob("*.py"):
        for name, default, line in _defaults(ast.parse(path.read_text())):
            if name not in DEFAULTS:
                continue
            where = f"{path.relative_to(PKG)}:{line} {name}"
            if isinstance(default, ast.Constant) and default.value is not None:
                copies.append(where)
            elif isinstance(default, ast.Name) and default.id == DEFAULTS[name]:
                uses += 1
    assert copies == []
    assert uses >= 8  # the check sees the options it is about
    # Values no other setting shares are written nowhere else at all.
    for value in (_config.CACHE_SIZE, _config.MAX_PIXELS):
        written = [
            f"{path.relative_to(PKG)}:{n.lineno}"
            for path in PKG.rglob("*.py")
            for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Constant) and n.value == value and type(n.value) is type(value)
        ]
        assert len(written) == 1, (value, written)
