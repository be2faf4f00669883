"""Names of a package imported on first use (PEP 562): a process that needs one part of the
package does not import the rest (``import asyncloader`` imports no store, no loop, no
torch).

Each public name is written once: as an import in the package's ``if TYPE_CHECKING:``
block (``from ._base._config import CacheConfig as CacheConfig``), which type checkers and
editors read; :func:`lazy_exports` reads the same block from the package's source to know
where each name lives, and ``__all__`` is made from it.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["lazy_exports"]


def exported(source: str) -> dict[str, str]:
    """Name → the module (relative: ``._base._config``) that defines it, from the
    ``if TYPE_CHECKING:`` block of a package's ``source``, in the order written."""
    out: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for inner in node.body:
                if isinstance(inner, ast.ImportFrom) and inner.level:
                    module = "." * inner.level + (inner.module or "")
                    out.update((alias.asname or alias.name, module) for alias in inner.names)
    return out


def lazy_exports(
    package: str, namespace: dict[str, Any]
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``__all__``, ``__getattr__`` and ``__dir__`` for ``package``, whose names its
    ``TYPE_CHECKING`` block maps to the submodule that defines each (:func:`exported`); a
    name once imported lands in ``namespace`` (the package's globals), so later lookups do
    not come back here."""
    where = exported(Path(namespace["__file__"]).read_text(encoding="utf-8"))

    def getattr_(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        # The exports, dunders and the submodules imported so far; not the helpers.
        own = {n for n, v in namespace.items() if n.startswith("__") or isinstance(v, ModuleType)}
        return sorted(own | set(where))

    return sorted(where), getattr_, dir_
