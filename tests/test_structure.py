"""The public surface and the direction of imports (see shared DESIGN.md)."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

import asyncloader

PKG = Path(asyncloader.__file__).parent

# The wings: concern packages, and the wings each may import.  Imports flow one way:
# _base < _stores < _dataset, _cache, _fetch, _decode, _device < _run < _loader < _tools <
# the faces.
# ``_lazy`` (the PEP 562 export helper) is a root helper any package's __init__ may use.
WINGS: dict[str, set[str]] = {
    "_base": set(),  # errors, types, configs, env, stats, manifests, leases, own threads
    "_stores": {"_base"},  # object stores by URL, their HTTP clients, the retry loop
    "_dataset": {"_base", "_stores"},  # URL + labels -> samples; listings saved in a folder
    "_cache": {"_base"},  # object bytes on the SSD, the writer thread, admission
    "_fetch": {"_base", "_stores"},  # bytes from a store: ranges, hedges, the budget
    "_decode": {"_base"},  # bytes -> pixels in a ring slot, and the backend rule
    "_device": {"_base"},  # the ring, and batches out (device, dtype, uploader)
    # The flow on one event loop: order, resume, pipeline, cache fill, runtime, composition.
    "_run": {"_base", "_stores", "_dataset", "_cache", "_fetch", "_decode", "_device"},
    # ImageLoader and where its engine runs: this process, or engine processes it supervises.
    "_loader": {"_base", "_stores", "_dataset", "_cache", "_fetch", "_decode", "_device", "_run"},
    "_tools": {
        "_base",
        "_stores",
        "_dataset",
        "_cache",
        "_fetch",
        "_decode",
        "_device",
        "_run",
        "_loader",
    },
    # The public test kit: stores and the retry loop, never the loader's machinery.
    "testing": {"_base", "_stores", "_fetch"},
}
# The files at the package root besides the wings: the public faces and their helpers.
ROOT = {"__init__.py", "__main__.py", "_lazy.py", "_cli.py", "torch.py"}


# Inside the decode package: pixels ← one job ← the pools.  ``_jpegroi`` and ``_resize`` are
# the C extensions beside ``_image``.
DECODE_SIBLINGS = {
    "_transforms": set(),
    "_image": {"_jpegroi", "_resize", "_transforms"},
    "_backend": {"_image"},
    "_job": {"_image"},
    "_completions": set(),
    "_ship": {"_image", "_job"},
    "_threads": {"_completions", "_image", "_job", "_ship"},
    "_resample": set(),
    "_nvjpeg": set(),
    "_gpu_batch": {"_completions", "_image", "_nvjpeg", "_resample"},
    "_gpu": {"_completions", "_gpu_batch", "_image", "_job", "_ship"},
}


# Inside ``_run``, two rooms in one order: the run's order and place (pure, or the job's
# store), then the flow on one event loop; a module imports its own room or the one before
# it, as named here.
RUN_ROOMS: list[dict[str, set[str]]] = [
    {  # the order, the run's place, the job: pure or the job's store, no loop
        "_sampler": set(),
        "_resume": {"_sampler"},
        "_position": {"_resume"},
        "_notices": set(),
        "_dist": set(),
        "_job": {"_sampler"},
    },
    {  # the flow on one loop: batch order, cache fill, pipeline, runtime, composition root
        "_batches": {"_sampler"},
        "_cache_fill": {"_sampler"},
        "_extras": {"_batches", "_cache_fill", "_sampler"},
        "_pipeline": {"_batches", "_cache_fill", "_extras", "_notices", "_sampler"},
        "_runtime": {"_pipeline"},
        "_build": {"_cache_fill", "_notices", "_pipeline"},
    },
]

# Inside ``_loader``, four rooms in one order: what the loader asks of an engine and what
# crosses to one; each side of the process boundary (the engine in the process that holds
# it and an engine process's main; the trainer's link to one and its reader); the trainer's
# supervision and the choice of where the engine goes; the consumer and ImageLoader.
LOADER_ROOMS: list[dict[str, set[str]]] = [
    {  # the surface, the messages, how a child starts
        "_surface": set(),
        "_wire": {"_surface"},
        "_launch": {"_wire"},
    },
    {  # one engine: in this process, an engine process's main; the trainer's link, reader
        "_local": {"_surface"},
        "_child": {"_launch", "_local", "_wire"},
        "_link": {"_launch", "_wire"},
        "_reader": {"_link", "_wire"},
    },
    {  # the engine processes as the trainer supervises them, and where the engine goes
        "_parent": {"_launch", "_link", "_reader", "_surface", "_wire"},
        "_start": {"_local", "_parent", "_surface", "_wire"},
    },
    {  # the loader: the consumer's waits, ImageLoader, its health where trainers look
        "_consumer": {"_surface"},
        "_image_loader": {"_consumer", "_start", "_surface"},
        "_health": set(),
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


def _imports_from(path: Path) -> list[tuple[str, ast.ImportFrom]]:
    """Every ``from X import ...`` of the file at ``path`` (at any depth: lazy imports and
    ``TYPE_CHECKING`` blocks too), with X made absolute."""
    package = ["asyncloader", *path.relative_to(PKG).parts[:-1]]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.append((module, node))
    return out


def _wings_imported(path: Path) -> set[str]:
    """The wings (and root modules) that the file at ``path`` imports."""
    out = set()
    for module, _ in _imports_from(path):
        parts = module.split(".")
        if parts[0] == "asyncloader" and len(parts) > 1:
            out.add(parts[1])
    return out


def test_the_root_holds_the_faces_and_the_wings() -> None:
    files = {p.name for p in PKG.iterdir() if p.is_file() and p.suffix in (".py", ".c")}
    assert files == ROOT
    packages = {p.name for p in PKG.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(WINGS)


@pytest.mark.parametrize("wing", sorted(WINGS))
def test_a_wing_s_docstring_names_every_module_it_holds(wing: str) -> None:
    doc = ast.get_docstring(ast.parse((PKG / wing / "__init__.py").read_text())) or ""
    modules = {p.stem for p in (PKG / wing).glob("*.py")} - {"__init__"}
    assert {m for m in modules if f"``{m}``" not in doc} == set()


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


@pytest.mark.parametrize(("wing", "rooms"), [("_run", RUN_ROOMS), ("_loader", LOADER_ROOMS)])
def test_a_wing_keeps_its_order(wing: str, rooms: list[dict[str, set[str]]]) -> None:
    """Every module of the wing has its place, imports only what its place allows, and no
    room imports a later one; a wing holds at most 12 modules, and its docstring names
    every one of them."""
    place = {name: i for i, room in enumerate(rooms) for name in room}
    modules = {p.stem for p in (PKG / wing).glob("*.py")} - {"__init__"}
    assert modules == set(place), modules ^ set(place)
    assert len(modules) <= 12
    for room in rooms:
        for name, allowed in room.items():
            siblings = _sibling_imports(PKG / wing / f"{name}.py")
            assert siblings <= allowed, f"{wing}/{name}.py imports {siblings - allowed}"
            later = {m for m in allowed if place[m] > place[name]}
            assert not later, f"{wing}/{name}.py may import later rooms: {later}"


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
    ("torch.py", "asyncloader._base._jobstore"),
    ("torch.py", "asyncloader._run._resume"),
    # The job's dataset as a rank counts it: ImageDataset.classes and len().
    ("torch.py", "asyncloader._run._job"),
    # ... its images' headers read in the node's cache where it holds them.
    ("torch.py", "asyncloader._run._cache_fill"),
    # The counts a rank's DataLoader workers leave for LoaderLogger, and their type.
    ("torch.py", "asyncloader._loader._health"),
    ("torch.py", "asyncloader._base._scalars"),
    # A DataLoader worker's exit, waiting for the batch its queue is still pickling.
    ("torch.py", "asyncloader._base._worker_exit"),
    # A resume state on its way to the dataset's DataLoader workers.
    ("torch.py", "asyncloader._base._worker_resume"),
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


def logic_lines(text: str) -> int:
    """The lines of ``text`` that hold code: not blank, not only a comment, and not part of
    a docstring (a string statement: a module's, a class's, a function's, an attribute's).
    A statement over several lines counts each of its lines."""
    tree = ast.parse(text)
    docs: set[int] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            assert node.end_lineno is not None
            docs.update(range(node.lineno, node.end_lineno + 1))
    code: set[int] = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in skip and tok.type != tokenize.ENDMARKER:
            code.update(range(tok.start[0], tok.end[0] + 1))
    return len(code - docs)


def test_logic_lines_count_code_only() -> None:
    text = (
        '"""A module.\n\nIts docstring."""\n\n'
        "import os  # a comment\n\n"
        "# a comment line\n"
        "def f(\n    a: int,\n) -> int:\n"
        '    """f\'s docstring."""\n'
        "    x = {\n        'a': 1,\n    }\n"
        '    return len("""a\nb""")\n'
    )
    # import, the signature's three lines, the dict's three, the return's two.
    assert logic_lines(text) == 9


def test_modules_stay_small() -> None:
    """One job a module, at most 350 logic lines (code, not comments, docstrings or blank
    lines: explanation is free, only a split by job lowers the count; STYLE.md, habit
    11)."""
    long = {
        str(p.relative_to(PKG)): n
        for p in PKG.rglob("*.py")
        if (n := logic_lines(p.read_text())) > 350
    }
    assert long == {}


def _module_imports(path: Path) -> set[str]:
    """The package's modules that the file at ``path`` imports (``asyncloader.x.y``): a
    circle broken by hiding one side from the interpreter (``TYPE_CHECKING``, a lazy
    import) is still a circle."""
    out = set()
    for module, node in _imports_from(path):
        if not module.startswith("asyncloader"):
            continue
        # ``from package import module`` imports the module (a C extension's too: its
        # source is beside it); any other name imports the package (or module) itself.
        for alias in node.names:
            name = f"{module}.{alias.name}"
            path_of = PKG.parent / name.replace(".", "/")
            if path_of.with_suffix(".py").is_file() or (path_of / "__init__.py").is_file():
                out.add(name)
            elif not path_of.with_suffix(".c").is_file():
                out.add(module)
    return out


def test_no_import_circle() -> None:
    """No module imports, directly or through others, a module that imports it back."""
    graph: dict[str, set[str]] = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.parts[-1] == "__init__" else rel.parts)
        graph[name] = _module_imports(path) - {name}
    # Tarjan's strongly connected components: any of two or more modules is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = set()
            while True:
                w = stack.pop()
                on.discard(w)
                part.add(w)
                if w == v:
                    break
            if len(part) > 1:
                circles.append(part)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert [sorted(c) for c in circles] == []
