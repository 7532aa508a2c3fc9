"""Check tests/README.md, the map from the shared failure cases to tests: it is complete and true.

* Every case in the shared cases folder (``../shared/cases`` beside the repository: a folder
  ``inputs/H<nn>_*`` or a heading ``### H<nn>`` in its ``CASES.md``) has a row ``| H<nn> | ... |``
  in tests/README.md, and each case row cites at least one test.
* Every test node id cited in tests/README.md names a test that exists, so a renamed or deleted
  test does not leave a dangling citation there.

When the cases folder is absent (a clone without ``../shared``), only the node ids are checked,
and the output says so. A node id is a backticked
``tests/<path>.py`` (the file must exist) or ``tests/<path>.py::<test>`` (or
``::<Class>::<test>``, optionally with a ``[param]`` suffix); the test must be a
``def``/``async def`` at module level (or in the named class) of that file, found by parsing the
file with :mod:`ast`, so nothing is imported or collected.

Usage::

    .venv/bin/python scripts/check_test_map.py [tests/README.md [CASES_FOLDER]]

Exits 1 and prints each case without a row (or without a test) and each dangling node id when
any is found; prints the counts checked otherwise.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT.parent / "shared" / "cases"
NODE_ID = re.compile(r"`(tests/[\w/.-]+\.py(?:::\w+)*)(?:\[[^\]`]*\])?`")
CASE_ID = re.compile(r"H\d+")
CASE_HEADING = re.compile(r"^#{2,4}\s*(H\d+)\b", re.M)
CASE_ROW = re.compile(r"^\|\s*(H\d+)\s*\|(.*)$", re.M)


def shared_case_ids(cases: Path) -> set[str]:
    """Case ids of the shared cases folder: its ``inputs/H<nn>_*`` entries and ``CASES.md`` headings.

    Args:
        cases: the shared cases folder.

    Returns:
        The case ids (``H01``, ...).
    """
    ids = set()
    inputs = cases / "inputs"
    if inputs.is_dir():
        for entry in inputs.iterdir():
            match = CASE_ID.match(entry.name)
            if match and (len(entry.name) == match.end() or entry.name[match.end()] in "_-."):
                ids.add(match.group())
    catalogue = cases / "CASES.md"
    if catalogue.is_file():
        ids.update(CASE_HEADING.findall(catalogue.read_text()))
    return ids


def unmapped_cases(readme: Path, cases: Path) -> tuple[list[str], int]:
    """Cases of ``cases`` without a row in ``readme``, and case rows that cite no test.

    Args:
        readme: the Markdown file whose table rows start ``| H<nn> |``.
        cases: the shared cases folder.

    Returns:
        (one line per problem, number of cases checked).
    """
    rows: dict[str, list[str]] = {}
    for case, rest in CASE_ROW.findall(readme.read_text()):
        rows.setdefault(case, []).extend(NODE_ID.findall(rest))
    ids = shared_case_ids(cases)
    problems = [f"case {case} of {cases} has no row in {readme.name}" for case in sorted(ids - set(rows))]
    problems += [f"the row of case {case} cites no test" for case in sorted(rows) if not rows[case]]
    return problems, len(ids)


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
    """Print the unmapped cases and dangling node ids of the README; 1 when any.

    ``argv[1]`` is the README (default ``tests/README.md``), ``argv[2]`` the shared cases folder
    (default ``../shared/cases`` beside the repository).
    """
    readme = Path(argv[1]) if len(argv) > 1 else ROOT / "tests" / "README.md"
    cases = Path(argv[2]) if len(argv) > 2 else CASES
    if cases.is_dir():
        unmapped, case_count = unmapped_cases(readme, cases)
        for line in unmapped:
            print(f"unmapped: {line}")
        print(f"{case_count} cases of {cases} checked, {len(unmapped)} without a row or a test")
    else:
        unmapped = []
        print(f"no cases folder at {cases}: only the cited node ids are checked")
    dangling, checked = dangling_node_ids(readme)
    for line in dangling:
        print(f"dangling: {line}")
    print(f"{checked} node ids checked in {readme}, {len(dangling)} dangling")
    return 1 if dangling or unmapped else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
