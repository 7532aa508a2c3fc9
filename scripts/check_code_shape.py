"""Two rules ruff and import-linter do not express, checked over the project's packages.

1. **Seams are public.** No module imports another module's underscore name
   (``from repository_sync.canary import _record``, or ``canary._record`` on an imported module).
   A helper another module needs gets a public name in the module that owns it.
2. **Functions fit on a screen.** No function or method is longer than ``MAX_FUNCTION_LINES``
   lines, counted from its ``def`` to its last line, without its docstring.

Usage: ``python scripts/check_code_shape.py [PATH ...]`` (default: the packages, the plugin and
the DAGs). Prints one line per finding, ``path:line: message``, and exits 1 when there is any.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ground", "drift_checks", "repository_sync", "model_registry", "tritonflow", "plugins", "dags")
PROJECT = ("ground", "drift_checks", "repository_sync", "model_registry", "tritonflow", "tritonflow_plugin")
MAX_FUNCTION_LINES = 80


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _docstring_lines(node: ast.AST) -> int:
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[0].end_lineno - body[0].lineno + 1
    return 0


def private_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """``(line, message)`` for each use of another project module's underscore name."""
    found: list[tuple[int, str]] = []
    modules: set[str] = set()  # local names bound to project modules
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] in PROJECT:
            for alias in node.names:
                if _is_private(alias.name):
                    found.append((node.lineno, f"imports {node.module}.{alias.name}"))
                else:
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PROJECT:
                    modules.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in modules and base.id not in ("self", "cls"):
                found.append((node.lineno, f"uses {ast.unparse(node)}"))
    return found


def long_functions(tree: ast.Module) -> list[tuple[int, str]]:
    """``(line, message)`` for each function longer than :data:`MAX_FUNCTION_LINES` (docstring excluded)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            length = node.end_lineno - start + 1 - _docstring_lines(node)
            if length > MAX_FUNCTION_LINES:
                found.append((node.lineno, f"function {node.name} is {length} lines (at most {MAX_FUNCTION_LINES})"))
    return found


def main(argv: list[str]) -> int:
    """Check the given paths (default :data:`PACKAGES`); return the exit status."""
    paths = [Path(p) for p in argv] or [ROOT / p for p in PACKAGES]
    files = sorted(f for p in paths for f in ([p] if p.is_file() else p.rglob("*.py")))
    findings = 0
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, message in sorted(private_imports(tree) + long_functions(tree)):
            print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line}: {message}")
            findings += 1
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
