"""Names of a package imported on first use (PEP 562): a process that needs one part of the
package (a decode worker) does not import the rest."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, where: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose names ``where`` maps to the
    submodule (relative) that defines each; a name once imported lands in ``namespace``
    (the package's globals), so later lookups do not come back here."""

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

    return getattr_, dir_
