"""Parsers of the list-valued settings, shared by the settings checks and the packages that read them.

Each takes the text of a ``TRITONFLOW_*`` variable (or an already-split sequence) and returns the
checked values, or raises an error that names the variable, the value and what was expected.
"""

from __future__ import annotations

from collections.abc import Sequence

from ground.exceptions import DataError, SettingsError

__all__ = ["parse_replica_urls", "parse_steps"]


def parse_replica_urls(text: str | Sequence[str]) -> list[str]:
    """``host:port`` list from a comma-separated string (or a sequence), order kept, duplicates dropped.

    Raises:
        DataError: An entry is not ``host:port``.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[str] = []
    for raw in items:
        url = str(raw).strip()
        if not url:
            continue
        if url.startswith(("http://", "https://")):
            url = url.split("://", 1)[1]
        url = url.rstrip("/")
        host, _, port = url.rpartition(":")
        if not host or not port.isdigit():
            raise DataError(f"Triton replica {raw!r} is not host:port (TRITONFLOW_TRITON_REPLICA_URLS)")
        if url not in out:
            out.append(url)
    return out


def parse_steps(value: str | Sequence[int], field: str = "canary_steps") -> tuple[int, ...]:
    """Parse and check a step schedule: integer percents, strictly increasing, ending at 100.

    Args:
        value: ``"5,25,50,100"`` or a sequence of ints.
        field: Name used in error messages.

    Raises:
        SettingsError: Not integers 1-100, not increasing, or the last step is not 100.
    """
    raw = value.split(",") if isinstance(value, str) else list(value)
    steps: list[int] = []
    for item in raw:
        text = str(item).strip()
        if isinstance(item, bool) or isinstance(item, float) or not text.lstrip("-").isdigit():
            raise SettingsError(f"{field}={value!r}: step {item!r} is not an integer percent")
        steps.append(int(text))
    if not steps or any(not 1 <= s <= 100 for s in steps):
        raise SettingsError(f"{field}={value!r}: expected percents between 1 and 100")
    # consecutive pairs: the shorter steps[1:] ends the pairing on purpose
    if any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
        raise SettingsError(f"{field}={value!r}: steps must increase strictly")
    if steps[-1] != 100:
        raise SettingsError(f"{field}={value!r}: the last step must be 100 (full promotion)")
    return tuple(steps)
