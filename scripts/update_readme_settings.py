"""Regenerate the README's configuration reference from ground.settings.Settings."""

import re
from pathlib import Path

from tritonflow.cli import settings_reference

readme = Path(__file__).resolve().parent.parent / "README.md"
text = readme.read_text()
pattern = re.compile(r"(<!-- settings:begin[^>]*-->\n).*?(\n<!-- settings:end -->)", re.S)
readme.write_text(pattern.sub(lambda m: m.group(1) + settings_reference(markdown=True) + m.group(2), text))
