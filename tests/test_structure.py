"""The public surface and the direction of imports (see shared DESIGN.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import asyncloader

PKG = Path(asyncloader.__file__).parent

# The wings: concern packages, and the wings each may import.  Imports flow one way:
# _base < _stores < _dataset, _cache, _fetch, _decode, _device < _run < _tools < the faces.
# ``_lazy`` (the PEP 562 export helper) is a root helper any package's __init__ may use.
WINGS: dict[str, set[str]] = {
    "_base": set(),  # errors, types, configs, env, stats, manifests, leases, own threads
    "_stores": {"_base"},  # object stores by URL, their HTTP clients, the retry loop
    "_dataset": {"_base", "_stores"},  # URL + labels -> samples; listings saved in a folder
    "_cache": {"_base"},  # object bytes on the SSD, the writer thread, admission
    "_fetch": {"_base", "_stores"},  # bytes from a store: ranges, hedges, the budget
    "_decode": {"_base"},  # bytes -> pixels in a ring slot, and the backend rule
    "_device": {"_base"},  # the ring, and batches out (device, dtype, uploader)
    "_run": {"_base", "_stores", "_dataset", "_cache", "_fetch", "_decode", "_device"},
    "_tools": {"_base", "_stores", "_dataset", "_cache", "_fetch", "_decode", "_device", "_run"},
    # The public test kit: stores and the retry loop, never the loader's machinery.
    "testing": {"_base", "_stores", "_fetch"},
}
# The files at the package root besides the wings: the public faces and their helpers.
ROOT = {"__init__.py", "__main__.py", "_lazy.py", "_cli.py", "torch.py"}


# Inside the decode package: pixels ← one job ← the pools; the worker process's side never
# imports the parent's (it starts with numpy, Pillow and what it runs, nothing more).
# ``_jpegroi`` and ``_resize`` are the C extensions beside ``_image``.
DECODE_SIBLINGS = {
    "_arena": set(),
    "_transforms": set(),
    "_image": {"_jpegroi", "_resize", "_transforms"},
    "_backend": {"_image"},
    "_job": {"_image"},
    "_completions": set(),
    "_threads": {"_completions", "_image", "_job"},
    "_worker": {"_arena", "_image", "_job"},
    "_processes": {"_arena", "_image", "_worker"},
    "_resample": set(),
    "_gpu": {"_completions", "_image", "_job", "_resample"},
}


# Inside ``_run``, three rooms in one order: the run's order and place (pure), the flow on
# one event loop, the engine (its surface, in this process, in processes of its own), then
# the loader over them; a module imports its own room or those before it, as named here.
RUN_ROOMS: list[dict[str, set[str]]] = [
    {  # the order, the run's place, the job: pure or the job's store, no loop
        "_sampler": set(),
        "_resume": {"_sampler"},
        "_position": {"_resume"},
        "_notices": set(),
        "_dist": set(),
    },
    {  # the flow on one loop: batch order, cache fill, pipeline, runtime, composition root
        "_batches": {"_sampler"},
        "_cache_fill": {"_sampler"},
        "_extras": {"_cache_fill"},
        "_pipeline": {"_batches", "_cache_fill", "_extras", "_notices", "_sampler"},
        "_runtime": {"_pipeline"},
        "_build": {"_cache_fill", "_notices", "_pipeline"},
    },
    {  # the engine: its surface and messages, inline, a process, the trainer's side
        "_control": {"_build", "_notices"},
        "_inline": {"_build", "_control", "_notices", "_pipeline", "_runtime"},
        "_engine": {"_control", "_inline", "_notices", "_pipeline"},
        "_link": {"_control", "_notices"},
        "_reader": {"_control", "_link"},
        "_engines": {
            "_batches",
            "_build",
            "_control",
            "_link",
            "_notices",
            "_reader",
            "_sampler",
        },
        "_assembly": {"_control", "_engines", "_inline"},
    },
    {  # the loader: the consumer's waits and ImageLoader
        "_consumer": {"_control", "_dist", "_notices", "_position"},
        "_loader": {
            "_assembly",
            "_build",
            "_consumer",
            "_control",
            "_dist",
            "_position",
            "_sampler",
        },
    },
]


def _internal_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level >= 1 and node.module:
            out.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level >= 1:
            out.update(a.name for a in node.names)
    return out


def test_exports() -> None:
    assert sorted(asyncloader.__all__) == sorted(set(asyncloader.__all__))
    for name in asyncloader.__all__:
        assert hasattr(asyncloader, name), name
    public = {n for n in dir(asyncloader) if not n.startswith("_")}
    submodules = {"testing", "torch"}
    assert public - set(asyncloader.__all__) - submodules == set()


def _wings_imported(path: Path) -> set[str]:
    """The wings (and root modules) that the file at ``path`` imports."""
    rel = path.relative_to(PKG)
    package = ["asyncloader", *rel.parts[:-1]]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[: len(package) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        parts = module.split(".")
        if parts[0] == "asyncloader" and len(parts) > 1:
            out.add(parts[1])
    return out


def test_the_root_holds_the_faces_and_the_wings() -> None:
    files = {p.name for p in PKG.iterdir() if p.is_file() and p.suffix in (".py", ".c")}
    assert files == ROOT
    packages = {p.name for p in PKG.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(WINGS)


def test_imports_flow_one_way_between_wings() -> None:
    for wing, allowed in WINGS.items():
        for path in (PKG / wing).rglob("*.py"):
            bad = _wings_imported(path) - allowed - {wing, "_lazy"}
            assert not bad, f"{path.relative_to(PKG)} imports {bad}"


def test_the_code_map_names_every_wing_and_module() -> None:
    """The code map (the design page of the docs, linked from README) is checked against
    the layout: every wing, and every module of each, is named in it (as ``_wing/`` and
    ``_module``)."""
    design = (PKG.parent / "docs" / "design.md").read_text()
    code_map = design.split("## Code map", 1)[1].split("\n## ", 1)[0]
    for wing in WINGS:
        assert f"`{wing}/`" in code_map, wing
        for path in (PKG / wing).glob("*.py"):
            if path.stem != "__init__":
                assert f"`{path.stem}`" in code_map, f"{wing}/{path.name}"
    for name in ROOT:
        assert f"`{name}`" in code_map, name


def test_run_keeps_its_order() -> None:
    """Every module of ``_run`` has its place, imports only what its place allows, and no
    room imports a later one."""
    place = {name: i for i, room in enumerate(RUN_ROOMS) for name in room}
    modules = {p.stem for p in (PKG / "_run").glob("*.py")} - {"__init__"}
    assert modules == set(place), modules ^ set(place)
    for room in RUN_ROOMS:
        for name, allowed in room.items():
            siblings = _sibling_imports(PKG / "_run" / f"{name}.py")
            assert siblings <= allowed, f"_run/{name}.py imports {siblings - allowed}"
            later = {m for m in allowed if place[m] > place[name]}
            assert not later, f"_run/{name}.py may import later rooms: {later}"


def _sibling_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        n.module
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module
    }


def test_decode_package_layers() -> None:
    for name, allowed in DECODE_SIBLINGS.items():
        tree = ast.parse((PKG / "_decode" / f"{name}.py").read_text())
        siblings = {
            n.module
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module
        }
        assert siblings <= allowed, f"_decode/{name}.py imports {siblings - allowed}"


def test_product_does_not_import_test_equipment() -> None:
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG)
        if rel.parts[0] == "testing":
            continue
        assert "testing" not in _internal_imports(path), f"{rel} imports asyncloader.testing"


def test_torch_not_imported_by_the_package() -> None:
    # Decode workers import the package; torch would cost them seconds and memory.
    import subprocess
    import sys

    code = "import sys, asyncloader, asyncloader._decode; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# The torch face may use the uploader, the one internal module that needs torch (the
# package root must not import torch: decode workers import it).
# to_device runs the device stage itself: its spec and its uploader.
FACE_EXCEPTIONS = {
    ("torch.py", "asyncloader._device._device_spec"),
    ("torch.py", "asyncloader._device._upload"),
    # The job's store (one listing per job, the ranks' agreement) and the state's keys.
    ("torch.py", "asyncloader._run._dist"),
    ("torch.py", "asyncloader._run._resume"),
    # The keywords that moved into configs, folded where the dataset is made.
    ("torch.py", "asyncloader._run._build"),
    # The node's ranks (LOCAL_WORLD_SIZE), read where every environment variable is.
    ("torch.py", "asyncloader._base._env"),
    # The command line's own argument types (its helpers, in a module of their own).
    ("_cli.py", "asyncloader._tools._args"),
}


def test_public_faces_use_only_the_public_api() -> None:
    for face in ("torch.py", "_cli.py"):
        tree = ast.parse((PKG / face).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                module = node.module if node.level == 0 else "asyncloader." + node.module
                if module.startswith("asyncloader") and (face, module) not in FACE_EXCEPTIONS:
                    assert not any(p.startswith("_") for p in module.split(".")), (face, module)
                    if node.level:
                        raise AssertionError(f"{face}: relative import of {module}")


def test_modules_stay_small() -> None:
    """One job a module, under 450 lines: a longer one is two jobs (STYLE.md, habit 11)."""
    long = {
        str(p.relative_to(PKG)): n
        for p in PKG.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 450
    }
    assert long == {}
