"""Decisions at a canary's pauses (promotion policy ``approve-steps``), through the coordination database.

Under ``approve-steps`` the ``canary`` task (:func:`tritonflow.pipelines.canary_promotion.run_promotion`)
pauses at the end of each step's bake (:mod:`repository_sync.canary.pauses` says when, what is
offered and the defaults). It stays the one task that holds the model's promotion lease (renewed by
its heartbeat) and keeps checking the challenger; the question is asked by other tasks of the run,
one per pause number (``step_decision``, :mod:`tritonflow_plugin.step_decisions`), which wait for
their pause to open and then for a person on Airflow's Required Actions page or the CLI
(``tritonflow decide``). Both sides meet in one row of the shared coordination database (table
``tritonflow_state``, scope :data:`SCOPE`, key :func:`pause_key` = ``<dag_id>/<run_id>``):

``{"model", "challenger", "canary_id", "slots", "timeout_s", "policy", "ended",
"pauses": {"<n>": {"number", "step", "percent", "attempt", "verdict", "reasons", "checks",
"options", "default", "opened_at", "deadline", "answer", "decision"}}}``

* :class:`PauseBoard` (the canary's side, a :class:`~repository_sync.canary.pauses.PauseControl`)
  opens pause ``n`` (the next number; ``None`` past ``slots``, the tasks there are), reads its
  ``answer`` and writes the ``decision`` it applies, and marks the row ``ended`` when the canary
  ends, so the tasks still waiting for a pause end too (skipped).
* :func:`answer_pause` (the asking task's side) writes a person's answer, in the same locked
  transaction as the canary's :meth:`PauseBoard.close`: an answer to a pause the canary already
  decided (its timeout, a failed check) is refused and reported, never applied later.

What the canary applies at each pause also goes on the challenger's MLflow version, as tag
``tritonflow.canary.<canary id>.pause.<nn>`` (JSON: step, percent, attempt, the automatic verdict,
the decision, who gave it, when, why, where it came from and the promotion policy in force), written
when the pause opens (``decision`` null: waiting) and again when it closes.
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from typing import Any, Callable, Mapping

from repository_sync.canary.pauses import DECISIONS, PauseDecision

#: Task id of the DAG's mapped tasks that ask a person at each pause (``tritonflow_plugin.step_decisions``).
PAUSE_TASK_ID = "step_decision"
#: Scope of the pause rows in the coordination database's state table.
SCOPE = "canary_pauses"
#: The options of a pause on the Required Actions page, per decision.
OPTION_LABELS = {"continue": "Continue", "hold": "Hold", "rollback": "Roll back"}
#: The decision of each option label.
LABEL_DECISIONS = {label: decision for decision, label in OPTION_LABELS.items()}


def pause_key(dag_id: str, run_id: str) -> str:
    """The key of a run's pauses: ``<dag_id>/<run_id>``."""
    return f"{dag_id}/{run_id}"


def pause_slots(steps: int, max_extensions: int) -> int:
    """The most pauses a canary of ``steps`` steps may make: each bake of each step ends in one."""
    return int(steps) * (1 + int(max_extensions))


def _iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="seconds")


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4g}{unit}"
    return f"{value}{unit}"


def checks_summary(analysis: Mapping[str, Any]) -> list[dict[str, str]]:
    """The checks of a step analysis (:meth:`StepAnalysis.to_dict`) as rows ``{check, value, limit}``."""
    t = analysis.get("thresholds") or {}
    quality = analysis.get("quality") or {}
    rows = [
        ("challenger requests", _fmt(analysis.get("canary_requests")), f">= {t.get('min_requests')}"),
        ("error rate", _fmt(analysis.get("canary_error_rate")), f"<= {t.get('max_error_rate')}"),
        ("mean latency", _fmt(analysis.get("canary_mean_latency_ms"), " ms"),
         f"<= {t.get('max_mean_latency_ms')} ms"),
        ("latency vs champion", _fmt(analysis.get("latency_ratio"), " x"), f"<= {t.get('max_latency_ratio')} x"),
        ("non-finite outputs", _fmt(analysis.get("predictions_nonfinite")), "0"),
        ("constant outputs", ", ".join(analysis.get("constant_outputs") or []) or "none", "none"),
        ("prediction KS vs expected", _fmt(analysis.get("prediction_ks")), f"<= {t.get('max_prediction_ks')}"),
        ("prediction PSI vs expected", _fmt(analysis.get("prediction_psi")), f"<= {t.get('max_prediction_psi')}"),
        ("quality vs champion", str(quality.get("note") or "not compared"),
         f"drop <= {t.get('max_quality_drop')}"),
        ("feature-space coverage", _fmt(analysis.get("coverage_ratio")), "covered"),
    ]
    return [{"check": c, "value": v, "limit": lim} for c, v, lim in rows]


def pause_request(pause: Mapping[str, Any], *, model: str, challenger: Any, champion: Any = None,
                  mlflow_url: str = "") -> dict[str, str]:
    """Subject and Markdown body of the question asked at ``pause`` (a pause row, see the module docstring)."""
    options = [OPTION_LABELS[d] for d in pause["options"]]
    default = OPTION_LABELS[pause["default"]]
    lines = [f"Canary of **{model}** version **{challenger}**"
             + (f" against champion version **{champion}**" if champion is not None else "")
             + f": step {pause['step']} at **{pause['percent']} %** of the traffic, bake {pause['attempt']}.", "",
             f"**Automatic verdict: {pause['verdict']}**" + (" (never a pass by itself)"
                                                             if pause["verdict"] == "inconclusive" else ""),
             "", "| check | value | limit |", "|---|---|---|"]
    lines += [f"| {r['check']} | {r['value']} | {r['limit']} |" for r in pause.get("checks") or []]
    reasons = list(pause.get("reasons") or [])
    if reasons:
        lines += ["", "Notes:", *[f"* {r}" for r in reasons[:8]]]
    lines += ["", f"Traffic stays at {pause['percent']} % while you decide; the checks keep running and a "
                  "failure rolls back at once.",
              f"* **Continue**: {'promote' if pause['percent'] == 100 else 'go on to the next step'}"]
    if "hold" in pause["options"]:
        lines.append("* **Hold**: bake this step once more, then decide again")
    lines.append("* **Roll back**: all traffic back to the champion now")
    lines += ["", f"No answer by {pause.get('deadline_iso') or '?'} takes the default: **{default}**.", ""]
    if mlflow_url:
        from urllib.parse import quote

        lines.append(f"[MLflow version]({mlflow_url.rstrip('/')}/#/models/{quote(str(model), safe='')}/versions/"
                     f"{challenger})")
    return {"subject": f"Canary of {model} v{challenger} at {pause['percent']} %: "
                       f"{pause['verdict']} ({' / '.join(options)})?",
            "body": "\n".join(lines)}


def pause_status(store: Any, key: str, number: int) -> dict[str, Any]:
    """Where pause ``number`` of ``key`` is: ``{"state", "pause", "row"}``.

    ``state``: ``"open"`` (asked, not decided), ``"closed"`` (decided), ``"ended"`` (the canary
    ended before deciding it, or before it opened) or ``"waiting"`` (not yet opened: the canary
    still runs, or has not started).
    """
    row = store.get_state(SCOPE, key) or {}
    pause = (row.get("pauses") or {}).get(str(int(number)))
    if pause is not None and pause.get("decision"):
        return {"state": "closed", "pause": pause, "row": row}
    if row.get("ended"):
        return {"state": "ended", "pause": pause, "row": row}
    return {"state": "open" if pause is not None else "waiting", "pause": pause, "row": row}


def answer_pause(store: Any, key: str, number: int, decision: str, *, by: str = "", at: str = "",
                 note: str = "") -> dict[str, Any]:
    """Give a person's answer at pause ``number`` of ``key``; the canary applies it at its next look.

    Args:
        store: The coordination store (:func:`ground.coordination.coordination_store`).
        key: :func:`pause_key` of the run.
        number: The pause's number.
        decision: One of :data:`~repository_sync.canary.pauses.DECISIONS` offered at that pause.
        by: Who answered (empty: nobody, e.g. the Required Actions timeout's default).
        at: When (ISO 8601; empty: now).
        note: The person's comment.

    Returns:
        ``{"taken": bool, "why": str}``: not taken when the pause is not open (never opened, or
        already decided: its timeout, a failed check, an earlier answer), or the decision is not
        offered there.
    """
    if decision not in DECISIONS:
        return {"taken": False, "why": f"decision {decision!r}: expected one of {', '.join(DECISIONS)}"}
    with store.locked_state(SCOPE, key) as (conn, row):
        pause = ((row or {}).get("pauses") or {}).get(str(int(number)))
        if pause is None:
            return {"taken": False, "why": f"pause {number} of {key} is not open"}
        if row.get("ended") and not pause.get("decision"):
            return {"taken": False, "why": f"the canary of {key} ended ({row['ended']}) before pause {number} "
                                           "was decided"}
        if pause.get("decision") or pause.get("answer"):
            done = pause.get("decision") or pause.get("answer")
            return {"taken": False, "why": f"pause {number} of {key} was already decided: {done.get('decision')} "
                                           f"({done.get('source') or 'person'}, by {done.get('by') or 'nobody'})"}
        if decision not in pause["options"]:
            return {"taken": False, "why": f"{decision!r} is not offered at pause {number} of {key} "
                                           f"(offered: {', '.join(pause['options'])})"}
        source = "person" if by else "timeout"
        pause["answer"] = PauseDecision(decision, by=by, at=at or _iso(time.time()), note=note,
                                        source=source).to_dict()
        store.set_state(SCOPE, key, row, conn=conn)
    return {"taken": True, "why": ""}


class PauseBoard:
    """The canary's side of its pauses (a :class:`~repository_sync.canary.pauses.PauseControl`).

    Args:
        store: The coordination store.
        key: :func:`pause_key` of the run.
        slots: Pauses that can be asked (the run's ``step_decision`` tasks); a later pause takes
            its default at once.
        timeout_s: Seconds a pause waits for an answer.
        record: Called with the MLflow version tags to write (e.g. the promotion's ``tag``).
        tag_prefix: Prefix of the pause tags (``tritonflow.canary.<canary id>.``).
        policy: The promotion policy in force (written on every decision).
        clock: Unix time now.
    """

    def __init__(self, store: Any, key: str, *, slots: int, timeout_s: float,
                 record: Callable[[dict[str, Any]], Any] | None = None, tag_prefix: str = "",
                 policy: str = "approve-steps", clock: Callable[[], float] = time.time) -> None:
        self.store, self.key, self.slots, self.timeout_s = store, key, int(slots), float(timeout_s)
        self.record, self.tag_prefix, self.policy, self.clock = record, tag_prefix, policy, clock

    def start(self, **about: Any) -> None:
        """Open the run's row for a canary (``about``: model, challenger, champion, canary_id).

        A retried canary (its worker lost) keeps the pauses its earlier attempt asked: it numbers
        its own after them, so each is asked by a task that has not answered yet.
        """
        with self.store.locked_state(SCOPE, self.key) as (conn, row):
            row = dict(row or {})
            row.update(about, slots=self.slots, timeout_s=self.timeout_s, policy=self.policy, ended=None)
            row.setdefault("pauses", {})
            self.store.set_state(SCOPE, self.key, row, conn=conn)

    def end(self, outcome: str) -> None:
        """Mark the canary ended: the tasks still waiting for a pause end (skipped)."""
        with self.store.locked_state(SCOPE, self.key) as (conn, row):
            row = dict(row or {})
            row["ended"] = outcome or "ended"
            self.store.set_state(SCOPE, self.key, row, conn=conn)

    def open(self, analysis: Any, options: tuple[str, ...], default: str) -> int | None:
        """Open the next pause with ``analysis``'s verdict and checks; ``None`` when no slot is left."""
        a = analysis.to_dict()
        now = self.clock()
        with self.store.locked_state(SCOPE, self.key) as (conn, row):
            row = dict(row or {})
            pauses = row.setdefault("pauses", {})
            number = len(pauses) + 1
            if number > self.slots:
                return None
            pause = {"number": number, "step": a["step"], "percent": a["percent"], "attempt": a["attempt"],
                     "verdict": a["verdict"], "reasons": list(a.get("reasons") or [])[:8],
                     "checks": checks_summary(a), "options": list(options), "default": default,
                     "opened_at": now, "deadline": now + self.timeout_s,
                     "deadline_iso": _iso(now + self.timeout_s), "answer": None, "decision": None}
            pauses[str(number)] = pause
            self.store.set_state(SCOPE, self.key, row, conn=conn)
        self._tag(number, pause)
        return number

    def answer(self, number: int) -> PauseDecision | None:
        """The answer a person gave at pause ``number``, else ``None``."""
        pause = (self.store.get_state(SCOPE, self.key) or {}).get("pauses", {}).get(str(int(number))) or {}
        answer = pause.get("answer")
        return PauseDecision(**answer) if answer else None

    def close(self, number: int | None, decision: PauseDecision, analysis: Any) -> None:
        """Record the decision applied at pause ``number`` (an answer given meanwhile is refused after)."""
        if number is None:
            a = analysis.to_dict()
            self._tag(0, {"number": None, "step": a["step"], "percent": a["percent"], "attempt": a["attempt"],
                          "verdict": a["verdict"], "decision": decision.to_dict()})
            return
        with self.store.locked_state(SCOPE, self.key) as (conn, row):
            pause = row["pauses"][str(int(number))]
            pause["decision"] = decision.to_dict()
            self.store.set_state(SCOPE, self.key, row, conn=conn)
        self._tag(number, pause)

    def _tag(self, number: int, pause: Mapping[str, Any]) -> None:
        if self.record is None:
            return
        decision = pause.get("decision") or {}
        value = {k: pause.get(k) for k in ("number", "step", "percent", "attempt", "verdict", "options", "default")}
        value.update(policy=self.policy, opened_at=_iso(pause["opened_at"]) if pause.get("opened_at") else None,
                     decision=decision.get("decision"), by=decision.get("by") or ("nobody" if decision else None),
                     at=decision.get("at") or (_iso(self.clock()) if decision else None),
                     note=decision.get("note"), source=decision.get("source"))
        name = f"pause.{number:02d}" if number else f"pause.none.{pause['step']:02d}.{pause['attempt']}"
        self.record({self.tag_prefix + name: json.dumps(value, sort_keys=True)})


__all__ = ["LABEL_DECISIONS", "OPTION_LABELS", "PAUSE_TASK_ID", "SCOPE", "PauseBoard", "answer_pause", "checks_summary",
           "pause_key", "pause_request", "pause_slots", "pause_status"]
