"""``tradeoff.__all__`` is the public API: it must list exactly what the package exposes."""

from __future__ import annotations
import __future__

import importlib.metadata
import inspect
import types

import tradeoff
from tradeoff import errors

# dunder names that are public on purpose
INCLUDED_PRIVATE = {"__version__"}


def _is_own_submodule(name: str, value: object) -> bool:
    # importing tradeoff.errors binds tradeoff.errors as an attribute: not an export
    return isinstance(value, types.ModuleType) and value.__name__ == f"tradeoff.{name}"


def test_all_lists_exactly_the_public_names() -> None:
    exposed = {
        name for name, value in vars(tradeoff).items()
        if (not name.startswith("_") or name in INCLUDED_PRIVATE)
        and not _is_own_submodule(name, value)
        and not isinstance(value, __future__._Feature)
    }
    assert set(tradeoff.__all__) == exposed


def test_all_has_no_duplicates_and_every_name_resolves() -> None:
    assert len(tradeoff.__all__) == len(set(tradeoff.__all__))
    for name in tradeoff.__all__:
        assert hasattr(tradeoff, name), name


def test_star_import_gives_all() -> None:
    namespace: dict[str, object] = {}
    exec("from tradeoff import *", namespace)
    namespace.pop("__builtins__")
    assert set(namespace) == set(tradeoff.__all__)


def test_version_matches_the_installed_distribution() -> None:
    assert tradeoff.__version__ == importlib.metadata.version("tradeoff")


def test_every_error_of_the_tree_is_exported() -> None:
    tree = {name for name, value in vars(errors).items()
            if inspect.isclass(value) and issubclass(value, Exception)
            and value.__module__ == errors.__name__}
    assert tree <= set(tradeoff.__all__)
    for name in tree:
        assert getattr(tradeoff, name) is getattr(errors, name)
        assert issubclass(getattr(tradeoff, name), tradeoff.TradeoffError)
        assert name in (errors.__doc__ or ""), f"{name} missing from the drawn error tree"


def test_request_errors_carry_http_status() -> None:
    statuses = {cls.__name__: cls.status for cls in (
        tradeoff.InvalidInput, tradeoff.NotFound, tradeoff.PayloadTooLarge,
        tradeoff.Unavailable, tradeoff.RequestTimeout, tradeoff.InferenceFailed)}
    assert statuses == {"InvalidInput": 400, "NotFound": 404, "PayloadTooLarge": 413,
                        "Unavailable": 503, "RequestTimeout": 503, "InferenceFailed": 500}
    assert all(issubclass(getattr(tradeoff, n), tradeoff.RequestError) for n in statuses)


def test_no_module_imports_a_name_of_the_package_root() -> None:
    """The root imports the result documents, so a module taking a name from the root
    (results.py took the version) made a cycle; the version lives in tradeoff/version.py.
    ``from tradeoff import dtypes`` names a submodule and is not one."""
    import re
    from pathlib import Path

    root = Path(tradeoff.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        if path == root / "__init__.py":
            continue
        for names in re.findall(r"^\s*from tradeoff import ([\w, ]+)$", path.read_text(),
                                re.MULTILINE):
            for name in (n.strip() for n in names.split(",")):
                if not ((root / f"{name}.py").exists() or (root / name).is_dir()):
                    offenders.append(f"{path.relative_to(root)}: {name}")
    assert not offenders, offenders
