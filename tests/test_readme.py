"""The README stays true: its two commands exist, CI runs its test command, and the generated
configuration reference (docs/configuration.md) lists every setting."""

import re
from pathlib import Path

from tritonflow.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _first_code_block() -> str:
    return re.search(r"```bash\n(.*?)```", README, re.S).group(1)


def test_the_readme_starts_with_the_main_job_and_the_test_command():
    commands = [line.split("#")[0].strip() for line in _first_code_block().splitlines() if line.strip()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    for command in commands:
        assert (ROOT / command.split()[1]).is_file()


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "scripts/test.sh" in ci


def test_the_configuration_reference_lists_every_setting():
    reference = (ROOT / "docs" / "configuration.md").read_text()
    assert re.search(r"<!-- settings:begin[^>]*-->\n.*\n<!-- settings:end -->", reference, re.S)
    missing = [name for name, _, _ in Settings.describe() if f"`{name}`" not in reference]
    assert missing == []


def test_no_placeholder_is_left_in_the_readme():
    assert not re.search(r"\b[A-Z]+_(SECTION|TABLE|ROW)\b", README)
