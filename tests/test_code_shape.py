"""scripts/check_code_shape.py finds what it names: another module's underscore names, long functions."""

import ast
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("check_code_shape", ROOT / "scripts" / "check_code_shape.py")
shape = importlib.util.module_from_spec(spec)
spec.loader.exec_module(shape)


def test_an_imported_underscore_name_of_another_project_module_is_reported():
    tree = ast.parse("from repository_sync.canary.runner import _bake_step, rollback\n"
                     "from tritonflow.pipelines import canary\n"
                     "canary._private()\n"
                     "from os import _exit\n"
                     "self._mine = 1\n")
    found = [message for _, message in shape.private_imports(tree)]
    assert found == ["imports repository_sync.canary.runner._bake_step", "uses canary._private"]


def test_a_function_over_the_cap_is_reported_without_counting_its_docstring():
    body = "\n".join(f"    x{i} = {i}" for i in range(shape.MAX_FUNCTION_LINES - 1))
    fits = f'def fits():\n    """Doc.\n\n    More doc.\n    """\n{body}\n'
    assert shape.long_functions(ast.parse(fits)) == []
    too_long = fits + "    y = 0\n"
    ((line, message),) = shape.long_functions(ast.parse(too_long))
    assert line == 1 and message.startswith(f"function fits is {shape.MAX_FUNCTION_LINES + 1} lines")

