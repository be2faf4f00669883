"""The public surface and the direction of imports (see shared DESIGN.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import asyncloader

PKG = Path(asyncloader.__file__).parent

LEAVES = {
    "_errors",
    "_types",
    "_config",
    "_stats",
    "_sampler",
    "_transforms",
    "_manifest",
    "_lease",
    "_retry",
    "_env",
    "_budget",
    "_lazy",
    "_admission",
    "_bench_report",
    "_resume",
    "_objects",
    "_own_thread",
    "_saved_listing",
    "_device_spec",
}
RESOURCES = {"_stores", "_decode", "_ring", "_labels", "_cache", "_upload"}
ALLOWED = {
    # module: modules of the package it may import
    **{m: LEAVES for m in LEAVES},
    **{m: LEAVES for m in RESOURCES},
    # The cache, over its C extension (the CRC-32).
    "_cache": LEAVES | {"_crc"},
    # The cache's writer thread, over the cache.
    "_cache_writer": LEAVES | {"_cache"},
    "_fetch": LEAVES | RESOURCES,
    # Manifests by location (a path, a key, a URL), read and written whole.
    "_located": LEAVES | RESOURCES,
    "_dataset": LEAVES | RESOURCES | {"_fetch", "_located"},
    # The fetch stage with a cache: each object fetched once on its way in.
    "_fetch_once": LEAVES | {"_fetch", "_cache_writer"},
    "_pipeline": LEAVES | RESOURCES | {"_fetch", "_fetch_once", "_dataset", "_cache_writer"},
    "_runtime": LEAVES | RESOURCES | {"_pipeline"},
    "_warm": LEAVES | RESOURCES | {"_fetch", "_cache_writer"},
    "_describe": LEAVES | RESOURCES | {"_fetch", "_located", "_dataset"},
    "_bench": LEAVES | RESOURCES | {"_fetch"},
    # The job's c10d store: one listing per job, the ranks' agreement on it.
    "_dist": LEAVES,
    "_loader": LEAVES | RESOURCES | {"_fetch", "_dataset", "_dist", "_pipeline", "_runtime"},
    # Test equipment: stores, the fetcher (the conformance suite retries through it), the
    # demo data; never the loader's machinery.
    "testing": LEAVES | RESOURCES | {"_fetch", "_demo"},
    # The demo data, and the emulator it is served from (imported when the demo runs).
    "_demo": LEAVES | {"testing"},
}

# Inside the decode package: pixels ← one job ← the pools; the worker process's side never
# imports the parent's (it starts with numpy, Pillow and what it runs, nothing more).
# ``_jpegroi`` and ``_resize`` are the C extensions beside ``_image``.
DECODE_SIBLINGS = {
    "_arena": set(),
    "_backend": {"_image"},
    "_image": {"_jpegroi", "_resize"},
    "_job": {"_image"},
    "_threads": {"_image", "_job"},
    "_worker": {"_arena", "_image", "_job"},
    "_processes": {"_arena", "_image", "_worker"},
}


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


def test_imports_flow_down() -> None:
    for module, allowed in ALLOWED.items():
        path = PKG / f"{module}.py"
        if not path.exists():
            path = PKG / module / "__init__.py"
            files = list((PKG / module).glob("*.py"))
        else:
            files = [path]
        for f in files:
            imported = _internal_imports(f) - {""}
            if f.parent.name == module:  # inside a package: its siblings are fine
                imported -= {p.stem for p in files}
                imported -= {p.stem for p in f.parent.glob("*.c")}  # C extensions
            bad = {m for m in imported if m.startswith("_") and m not in allowed}
            assert not bad, f"{f.relative_to(PKG)} imports {bad}"


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
        if rel.parts[0] == "testing" or rel.name == "_demo.py":
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
# The CLI's demo command runs on the demo data and its emulator bucket (package proper).
# to_device runs the device stage itself: its spec and its uploader.
FACE_EXCEPTIONS = {
    ("torch.py", "asyncloader._device_spec"),
    ("torch.py", "asyncloader._upload"),
    # The job's store (one listing per job, the ranks' agreement) and the state's keys.
    ("torch.py", "asyncloader._dist"),
    ("torch.py", "asyncloader._resume"),
    ("_cli.py", "asyncloader._demo"),
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
