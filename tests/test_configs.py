"""The loader's face: about 14 everyday keywords and one frozen config per concern, each
field spelled once, no aliases; ``ImageDataset``'s options typed as the loader's; every
default resolved in one place."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import typing
import warnings
from pathlib import Path
from typing import Any

import pytest

import asyncloader as al
from asyncloader._base import _config
from asyncloader.testing import MemoryBucket, MemoryStore

from .conftest import N_IMAGES

PKG = Path(al.__file__).parent
CONFIGS = {
    "decode": al.DecodeConfig,
    "fetch": al.FetchConfig,
    "store": al.StoreConfig,
    "errors": al.ErrorConfig,
    "cache": al.CacheConfig,
    "shard": al.ShardConfig,
    "output": al.OutputConfig,
    "engine": al.EngineConfig,
}


@pytest.fixture(scope="module")
def bucket(jpeg_folder: Path) -> MemoryBucket:
    return MemoryBucket(
        {p.relative_to(jpeg_folder).as_posix(): p.read_bytes() for p in jpeg_folder.rglob("*.jpg")}
    )


def _memory(bucket: MemoryBucket) -> al.StoreConfig:
    return al.StoreConfig(object_store=MemoryStore(bucket))


def test_the_face_has_few_keywords_and_one_config_per_concern() -> None:
    params = inspect.signature(al.ImageLoader).parameters
    assert not any(p.kind is p.VAR_KEYWORD for p in params.values())
    hints = typing.get_type_hints(al.ImageLoader.__init__)
    configs = {n for n in params if n in CONFIGS}
    assert configs == set(CONFIGS)
    for name, kind in CONFIGS.items():
        assert hints[name] == kind | None, name
        assert dataclasses.is_dataclass(kind) and kind.__dataclass_params__.frozen  # type: ignore[attr-defined]
    flat = [n for n in params if n not in CONFIGS]
    assert len(flat) <= 16, flat
    # Each field spelled once: no keyword of the loader is also a field of a config, and no
    # field is in two configs.
    fields = [f.name for kind in CONFIGS.values() for f in dataclasses.fields(kind)]
    assert len(fields) == len(set(fields)), sorted(f for f in fields if fields.count(f) > 1)
    assert set(flat) & set(fields) == set()


def test_image_dataset_takes_the_loader_s_options_typed() -> None:
    from asyncloader.torch import ImageDataset

    options = set(al.LoaderOptions.__annotations__)
    loader = set(inspect.signature(al.ImageLoader).parameters) - {"url", "rank", "world_size"}
    assert options == loader
    hints = typing.get_type_hints(al.LoaderOptions)
    for name, hint in typing.get_type_hints(al.ImageLoader.__init__).items():
        if name in options:
            assert hints[name] == hint, name
    var = inspect.signature(ImageDataset).parameters["options"]
    assert var.kind is var.VAR_KEYWORD and "Unpack" in str(var.annotation)


def test_a_keyword_the_loader_never_had_is_a_type_error(bucket: MemoryBucket) -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'prefetch'"):
        al.ImageLoader(prefetch=3, store=_memory(bucket))  # type: ignore[call-arg]
    # Not even the spellings of before the configs: nothing was released.
    with pytest.raises(TypeError, match="unexpected keyword argument 'decode_workers'"):
        al.ImageLoader(decode_workers=2, store=_memory(bucket))  # type: ignore[call-arg]


def test_a_hook_or_a_store_object_where_its_config_goes_says_how(bucket: MemoryBucket) -> None:
    with pytest.raises(TypeError, match=r"DecodeConfig\(hook=\.\.\., sample_shape="):
        al.ImageLoader(decode=bytes, store=_memory(bucket))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"StoreConfig\(object_store=\.\.\.\)"):
        al.ImageLoader(store=MemoryStore(bucket))  # type: ignore[arg-type]


def test_configs_run_and_raise_no_warning(bucket: MemoryBucket, tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with al.ImageLoader(
            batch_size=16,
            transform=al.RandomResizedCrop(32),
            shuffle=False,
            cache_dir=tmp_path / "c",
            cache=al.CacheConfig(size="1GB"),
            decode=al.DecodeConfig(workers=1, max_pixels=10**8),
            engine=al.EngineConfig(prefetch_batches=6),
            shard=al.ShardConfig(even="drop", drop_last=True),
            errors=al.ErrorConfig(on_error="skip", max_failures=2),
            store=_memory(bucket),
        ) as loader:
            assert loader.cache is not None and loader.cache.size_limit == 10**9
            got = [lab.tolist() for _, lab in loader]
            assert loader.stats().ring_slots == 6
    assert sum(map(len, got)) == N_IMAGES // 16 * 16  # drop_last


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: al.EngineConfig(event_loop="trio"), "event_loop"),  # type: ignore[arg-type]
        (lambda: al.EngineConfig(prefetch_batches=0), "prefetch_batches"),
        (lambda: al.DecodeConfig(max_pixels=0), "max_pixels"),
        (lambda: al.DecodeConfig(workers=0), "workers"),
        (lambda: al.DecodeConfig(hook=bytes), "sample_shape"),  # type: ignore[arg-type]
        (lambda: al.DecodeConfig(backend="gpu"), "backend"),  # type: ignore[arg-type]
        (lambda: al.CacheConfig(listing_max_age=-1), "listing_max_age"),
        (lambda: al.ErrorConfig(on_error="ignore"), "on_error"),  # type: ignore[arg-type]
        (lambda: al.ErrorConfig(max_failures=-1), "max_failures"),
        (lambda: al.ShardConfig(worker=2, num_workers=2), "worker"),
        (lambda: al.ShardConfig(even="pad-some"), "even"),  # type: ignore[arg-type]
        (lambda: al.ShardConfig(local_world_size=0), "local_world_size"),
        (lambda: al.OutputConfig(mean=(0.5, 0.5)), "mean"),
        (lambda: al.OutputConfig(std=(0.0,)), "std"),
        (lambda: al.OutputConfig(pin="always"), "pin"),  # type: ignore[arg-type]
    ],
)
def test_a_config_refuses_what_cannot_work(make: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_store_options_are_a_mapping_and_extensions_a_sequence() -> None:
    with pytest.raises(TypeError, match="options"):
        al.StoreConfig(options="endpoint_url=x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="extensions"):
        al.StoreConfig(extensions=".jpg")


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
