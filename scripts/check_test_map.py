"""Check that every test node id cited in tests/README.md names a test that exists.

tests/README.md is the one place that maps the shared failure cases to tests, so a renamed or
deleted test must not leave a dangling citation there. A node id is a backticked
``tests/<path>.py`` (the file must exist) or ``tests/<path>.py::<test>`` (or
``::<Class>::<test>``, optionally with a ``[param]`` suffix); the test must be a
``def``/``async def`` at module level (or in the named class) of that file, found by parsing the
file with :mod:`ast`, so nothing is imported or collected.

Usage::

    .venv/bin/python scripts/check_test_map.py [tests/README.md]

Exits 1 and prints each dangling node id when any is found; prints the count checked otherwise.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODE_ID = re.compile(r"`(tests/[\w/.-]+\.py(?:::\w+)*)(?:\[[^\]`]*\])?`")


def defined_tests(path: Path) -> set[str]:
    """Node-id tails (``name`` or ``Class::name``) of the functions defined in a test file.

    Args:
        path: a Python test file.

    Returns:
        Module-level function names and ``Class::method`` for methods of module-level classes.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.update(f"{node.name}::{item.name}" for item in node.body
                         if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return names


def dangling_node_ids(readme: Path) -> tuple[list[str], int]:
    """Node ids cited in ``readme`` whose file or test does not exist.

    Args:
        readme: the Markdown file that cites the node ids.

    Returns:
        (dangling node ids with the reason, number of distinct node ids checked).
    """
    cited = sorted(set(NODE_ID.findall(readme.read_text())))
    cache: dict[str, set[str]] = {}
    dangling = []
    for node_id in cited:
        file, _, tail = node_id.partition("::")
        path = ROOT / file
        if not path.is_file():
            dangling.append(f"{node_id}: no file {file}")
            continue
        if not tail:
            continue  # a whole file is cited: its existence is enough
        if file not in cache:
            cache[file] = defined_tests(path)
        if tail not in cache[file]:
            dangling.append(f"{node_id}: no test {tail!r} in {file}")
    return dangling, len(cited)


def main(argv: list[str]) -> int:
    """Print the dangling node ids of the README (default ``tests/README.md``); 1 when any."""
    readme = Path(argv[1]) if len(argv) > 1 else ROOT / "tests" / "README.md"
    dangling, checked = dangling_node_ids(readme)
    for line in dangling:
        print(f"dangling: {line}")
    print(f"{checked} node ids checked in {readme}, {len(dangling)} dangling")
    return 1 if dangling else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
