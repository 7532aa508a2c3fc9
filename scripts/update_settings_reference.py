"""Regenerate docs/configuration.md's settings table from tritonflow's settings.

Rewrites what lies between the ``<!-- settings:begin ... -->`` and ``<!-- settings:end -->`` markers
with ``tritonflow settings --markdown``'s table; everything outside the markers is kept. Run it
after adding or changing a setting: ``.venv/bin/python scripts/update_settings_reference.py``.
"""

import re
import sys
from pathlib import Path

from tritonflow.cli import settings_reference

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
MARKERS = re.compile(r"(<!-- settings:begin[^>]*-->\n).*?(\n<!-- settings:end -->)", re.S)


def main() -> int:
    """Write the generated table between the markers; 1 when the markers are missing."""
    text = REFERENCE.read_text()
    if not MARKERS.search(text):
        print(f"{REFERENCE}: no <!-- settings:begin --> ... <!-- settings:end --> markers", file=sys.stderr)
        return 1
    REFERENCE.write_text(MARKERS.sub(lambda m: m.group(1) + settings_reference(markdown=True) + m.group(2), text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
