"""Every module of the package says what it offers in ``__all__``, and the list stays
honest: each name it lists is defined there (a package's ``__init__`` may list what it
imports), and each public function and class defined there is listed. Read from the
source, so a module that needs torch is checked without it."""

from __future__ import annotations

import ast
from pathlib import Path

import tradeoff

PACKAGE = Path(tradeoff.__file__).parent
SKIPPED = {"__main__.py"}  # a script, not a module to import from


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py")
                  if p.name not in SKIPPED and not p.name.endswith("_pb2.py"))


def top_level(tree: ast.Module) -> list[ast.stmt]:
    """The module's statements, with those of top-level ``if`` and ``try`` blocks."""
    out: list[ast.stmt] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            out.append(node)
            if isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)

    visit(tree.body)
    return out


def bound_names(nodes: list[ast.stmt]) -> tuple[set[str], set[str]]:
    """(names a statement defines, names an import binds)."""
    defined: set[str] = set()
    imported: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return defined, imported


def declared(nodes: list[ast.stmt]) -> list[str] | None:
    for node in nodes:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            value = ast.literal_eval(node.value)
            assert isinstance(value, list | tuple)
            return [str(v) for v in value]
    return None


def test_every_module_declares_an_honest_all() -> None:
    missing, unknown, unlisted, repeated = [], [], [], []
    for path in modules():
        where = str(path.relative_to(PACKAGE))
        nodes = top_level(ast.parse(path.read_text()))
        if all(isinstance(n, ast.Expr) for n in nodes):
            continue  # a package's docstring alone: nothing to offer
        names = declared(nodes)
        if names is None:
            missing.append(where)
            continue
        if len(set(names)) != len(names):
            repeated.append(where)
        defined, imported = bound_names(nodes)
        known = defined | imported if path.name == "__init__.py" else defined
        unknown += [f"{where}: {n}" for n in names if n not in known]
        public = {node.name for node in nodes
                  if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                  and not node.name.startswith("_")}
        unlisted += [f"{where}: {n}" for n in sorted(public - set(names))]
    assert not missing, f"modules without __all__: {missing}"
    assert not unknown, f"__all__ lists names the module does not define: {unknown}"
    assert not unlisted, f"public functions and classes missing from __all__: {unlisted}"
    assert not repeated, f"__all__ lists a name twice: {repeated}"
