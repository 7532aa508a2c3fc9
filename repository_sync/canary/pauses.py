"""Pauses of a canary: a person decides at the end of each step's bake (promotion policy ``approve-steps``).

:func:`repository_sync.canary.runner.run_canary` takes an optional :class:`PauseControl`. With one,
every step that ends its bake *passed* or *inconclusive* pauses: traffic stays at the step's split,
the control is asked (:meth:`PauseControl.open`) and the runner waits for its answer
(:meth:`PauseControl.answer`) while it keeps analysing the step every ``analysis_interval_s`` (the
hard checks: a failure while waiting rolls back at once, without waiting any longer). The answer is
one of :data:`DECISIONS`:

* ``continue`` -- the step is done: on to the next one (at the last step: promote);
* ``hold`` -- bake the step once more (``bake_s`` more seconds, the window growing), then pause
  again. A hold uses one of the step's ``max_extensions``, as an automatic extension of an
  inconclusive step does; with none left, ``hold`` is not offered;
* ``rollback`` -- roll back now (gateway to the champion first, then unload the challenger).

The default, taken when nobody answers within :attr:`PauseControl.timeout_s`, is what the canary
would have done by itself: ``continue`` after a passed verdict, ``hold`` (an extension) after an
inconclusive one. A failed verdict never pauses: it rolls back at once, as without pauses, and so
does a step still inconclusive after its last extension.

Nothing here knows where the question is asked; :mod:`tritonflow.pipelines.canary_pauses` asks it
on Airflow's Required Actions page through the shared coordination database.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

#: Go on to the next step (at the last step: promote).
CONTINUE_DECISION = "continue"
#: Bake the step once more, then pause again.
HOLD_DECISION = "hold"
#: Roll back now.
ROLLBACK_DECISION = "rollback"
#: The decisions a pause may take, in the order they are offered.
DECISIONS = (CONTINUE_DECISION, HOLD_DECISION, ROLLBACK_DECISION)
#: Where a decision came from: a person, the pause's timeout (the default), a check that failed
#: while waiting, or no pause left to ask at (the default, at once).
SOURCES = ("person", "timeout", "check", "no pause left")


@dataclasses.dataclass(frozen=True)
class PauseDecision:
    """What was decided at one pause.

    Attributes:
        decision: One of :data:`DECISIONS`.
        by: Who decided (empty: nobody, e.g. the timeout's default).
        at: When (ISO 8601; empty: not known).
        note: Why (a person's comment, the failed check's reason).
        source: One of :data:`SOURCES`.
    """

    decision: str
    by: str = ""
    at: str = ""
    note: str = ""
    source: str = "person"

    def __post_init__(self) -> None:
        if self.decision not in DECISIONS:
            raise ValueError(f"pause decision {self.decision!r}: expected one of {', '.join(DECISIONS)}")
        if self.source not in SOURCES:
            raise ValueError(f"pause decision source {self.source!r}: expected one of {', '.join(SOURCES)}")

    def to_dict(self) -> dict[str, str]:
        """Plain dict (JSON)."""
        return dataclasses.asdict(self)


class PauseControl(Protocol):
    """Where a canary's pauses are asked and answered.

    Attributes:
        timeout_s: Seconds a pause waits for an answer before it takes its default.
    """

    timeout_s: float

    def open(self, analysis: Any, options: tuple[str, ...], default: str) -> int | None:
        """Ask at the end of a step's bake; the pause's number, or ``None`` when none can be asked.

        Args:
            analysis: The step's final :class:`~repository_sync.canary.analysis.StepAnalysis`
                (the automatic verdict and its checks, to show to the person).
            options: The decisions offered (:data:`DECISIONS`, ``hold`` left out when the step
                has no extension left).
            default: The decision taken on timeout.
        """

    def answer(self, number: int) -> PauseDecision | None:
        """The answer given at pause ``number`` so far, else ``None``."""

    def close(self, number: int | None, decision: PauseDecision, analysis: Any) -> None:
        """Record the decision the canary applies at pause ``number`` (``None``: none could be asked)."""


def offered(passed: bool, extension_left: bool) -> tuple[tuple[str, ...], str]:
    """The decisions offered at a pause and its default.

    Args:
        passed: The step's automatic verdict passed (else it is inconclusive).
        extension_left: The step may still be baked once more.

    Returns:
        ``(options, default)``: ``continue`` is the default only after a passed verdict;
        after an inconclusive one it is ``hold`` (what the canary does by itself).

    Raises:
        ValueError: Inconclusive with no extension left (that verdict is a failure: no pause).
    """
    if not passed and not extension_left:
        raise ValueError("an inconclusive step with no extension left has failed: it does not pause")
    options = DECISIONS if extension_left else (CONTINUE_DECISION, ROLLBACK_DECISION)
    return options, CONTINUE_DECISION if passed else HOLD_DECISION


__all__ = ["CONTINUE_DECISION", "DECISIONS", "HOLD_DECISION", "ROLLBACK_DECISION", "SOURCES", "PauseControl",
           "PauseDecision", "offered"]
