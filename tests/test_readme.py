"""The README and docs/ stay true: the README is a front page that starts with its two commands,
CI runs its test command, the generated configuration reference lists every setting, and every
relative link and picture of the README and docs/ points at a file that exists."""

import re
from pathlib import Path

from ground.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = sorted((ROOT / "docs").glob("*.md"))
#: The README is a front page (issue 28): what tritonflow does, the two commands, what you see, one
#: architecture picture, measured figures, limits in one screen. Everything else lives in docs/.
README_MAX_LINES = 250


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


def test_the_readme_is_a_front_page():
    assert len(README.splitlines()) <= README_MAX_LINES


def test_the_configuration_reference_lists_every_setting():
    reference = (ROOT / "docs" / "configuration.md").read_text()
    assert re.search(r"<!-- settings:begin[^>]*-->\n.*\n<!-- settings:end -->", reference, re.S)
    missing = [name for name, _, _ in Settings.describe() if f"`{name}`" not in reference]
    assert missing == []


def test_no_placeholder_is_left_in_the_readme_or_docs():
    for page, text in [(ROOT / "README.md", README)] + [(doc, doc.read_text()) for doc in DOCS]:
        assert not re.search(r"\b[A-Z]+_(SECTION|TABLE|ROW)\b", text), page


def test_every_relative_link_and_picture_points_at_a_file():
    """``[text](path)`` and ``![alt](path)`` outside code, relative to the page, with any ``#anchor``."""
    broken = []
    for page in [ROOT / "README.md", *DOCS]:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            path = target.split("#", 1)[0]
            if not path or re.match(r"[a-z]+:", path):
                continue
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def test_every_anchor_of_a_link_between_pages_exists():
    """``page.md#heading`` and ``#heading`` links name a heading of that page (GitHub's anchors)."""

    def anchors(page: Path) -> set[str]:
        headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", page.read_text(), flags=re.S), re.M)
        return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}

    broken = []
    for page in [ROOT / "README.md", *DOCS]:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]*#[^)\s]+)\)", text):
            path, anchor = target.split("#", 1)
            linked = page.parent / path if path else page
            if re.match(r"[a-z]+:", path) or not linked.is_file() or linked.suffix != ".md":
                continue
            if anchor not in anchors(linked):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []
