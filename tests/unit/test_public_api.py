"""The public API is exactly what `__all__` says, and every name listed exists."""

from __future__ import annotations

import importlib
import pkgutil
import types

import infaas

# Modules that import heavy frameworks at module level or need optional hardware are still listed:
# importing them must not pull TensorFlow or Ray (lazy imports), so this walk stays cheap.
PACKAGES = ("infaas", "variants", "profiler")


def _modules() -> list[types.ModuleType]:
    mods = []
    for name in PACKAGES:
        pkg = importlib.import_module(name)
        mods.append(pkg)
        for info in pkgutil.walk_packages(pkg.__path__, prefix=f"{name}."):
            mods.append(importlib.import_module(info.name))
    return mods


def test_every_name_in_all_exists() -> None:
    for mod in _modules():
        for name in getattr(mod, "__all__", ()):
            assert hasattr(mod, name), f"{mod.__name__}.__all__ lists missing {name!r}"


def test_top_level_public_names_are_exactly_all() -> None:
    public = {
        n for n, v in vars(infaas).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)
    }
    public.discard("annotations")
    assert public == set(infaas.__all__) - {"__version__"}
