"""Shadow evaluation, live mode: the challenger answers mirrored live requests.

Shadow evaluation, live mode: the challenger answers a mirrored share of the champion's live
requests; champion and challenger outputs are paired by request id on the same live inputs.

:func:`live` replaces :func:`tritonflow.pipelines.shadow_replay.replay` when a model has live traffic
(``shadow_evaluation`` with ``mode="live"``); replay stays for models without it. It returns the
same dict, so :func:`tritonflow.pipelines.shadow_compare.compare` decides and records as for a replay:

1. the champion and challenger are resolved as for a replay; the challenger is loaded if needed
   (and unloaded again at the end, only that version);
2. under the model's promotion lock (the live shadow changes what the gateway does, so it never
   overlaps a canary of the same model) and only while the gateway routes 100 % of the model to the
   champion, a :class:`repository_sync.routing.mirror.MirrorRecorder` starts and the gateway's plan gains a
   :class:`repository_sync.routing.traffic_plan.Mirror` of ``settings.shadow_mirror_percent`` % of the champion's
   requests; after ``settings.shadow_live_duration_s`` seconds the previous plan is restored
   exactly and the recorder drains;
3. the mirrored answers are paired with the champion's logged records (inference log) by
   ``request_id``: clients must log the request id the gateway returns (``X-Request-Id``: their
   own when they send one). The pairs become the predictions file and the challenger's expected
   predictions (:func:`tritonflow.pipelines.shadow_replay.write_expected`, source ``"live_mirror"``).
   A multi-class model (the log holds one probability column per class, in class order) is
   stored per class as in a replay (:mod:`tritonflow.pipelines.shadow_classes`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import numpy as np

from ground.exceptions import ChallengerUnavailableError, DataError, TransientError, WindowError
from ground.settings import Settings
from tritonflow.pipelines.shadow import VersionInfo

#: Seconds after the mirror stops during which the clients' log of the window is still awaited
#: (records are written after their requests complete).
LOG_GRACE_S = 5.0


def _challenger_scores(mirrored: Any, output: str) -> np.ndarray:
    """The challenger's score per mirrored row from its ``output`` (shadow's scoring rule).

    One column: that column; two (binary probabilities): the second; more: the ``[n, C]`` class
    probabilities, columns ``<output>_<c>`` in class order.
    """
    base = f"mirror.{output}"
    cols = [c for c in mirrored.columns if c == base or c.startswith(base + "_")]
    if not cols:
        raise DataError(f"mirrored answers have no output {output!r} (columns: {sorted(mirrored.columns)})")
    if len(cols) == 1:
        return mirrored[cols[0]].to_numpy(dtype=np.float64)
    ordered = sorted(cols, key=lambda c: int(c.rsplit("_", 1)[1]) if c.rsplit("_", 1)[1].isdigit() else -1)
    if len(cols) == 2:
        return mirrored[ordered[1]].to_numpy(dtype=np.float64)
    return mirrored[ordered].to_numpy(dtype=np.float64)  # [n, C] class probabilities


@dataclasses.dataclass(frozen=True)
class _LivePair:
    """Champion and challenger of one live shadow, validated: one Triton model, two versions."""

    model: str
    champ: VersionInfo
    chal: VersionInfo
    duration_s: float
    percent: int

    @property
    def name(self) -> str:
        return self.champ["triton_model_name"]

    @property
    def champion_version(self) -> int:
        return int(self.champ["triton_model_version"])

    @property
    def challenger_version(self) -> int:
        return int(self.chal["triton_model_version"])


@dataclasses.dataclass(frozen=True)
class _MirrorWindow:
    """What the mirror recorded: the challenger's answers, the window, the output it scored."""

    counters: dict[str, Any]
    mirrored: Any  # pandas.DataFrame of the recorder's records
    t0: float
    t1: float
    output: str
    newly_loaded: bool


def live(model: str, champion: Any, challenger: Any, *, settings: Settings | None = None,
         duration_s: float | None = None, percent: int | None = None, holder: str = "",
         sleep: Callable[[float], Any] = time.sleep) -> dict[str, Any]:
    """Mirror live traffic to the challenger for a while and pair the outputs (module docstring).

    Args:
        model: Registered model name (also the inference log's model folder).
        champion: Version info from ``resolve_versions``, a version or an alias.
        challenger: Version info from ``resolve_versions``, a version or an alias.
        settings: Settings (gateway, Triton, log root, ``shadow_mirror_*``, lock timeout).
        duration_s: Seconds of mirroring (default ``settings.shadow_live_duration_s``).
        percent: Percent of the champion's requests mirrored (default
            ``settings.shadow_mirror_percent``).
        holder: Who holds the promotion lock meanwhile.
        sleep: Waits the window (injected by tests).

    Returns:
        :func:`~tritonflow.pipelines.shadow_replay.replay`'s dict with ``"mode": "live"``, plus
        ``"mirror"`` (received/forwarded/failed/dropped counts) and ``"paired"``.

    Raises:
        DataError: No challenger, champion and challenger are different Triton models, bad
            duration/percent, or the gateway does not route the model 100 % to the champion (a
            canary in progress).
        WindowError: No mirrored answer could be paired with a logged request.
        ChallengerUnavailableError: The challenger could not be loaded.
        ConcurrencyError: A promotion of the model holds its lock.
    """
    from tritonflow.pipelines.shadow import settings_or_default

    s = settings_or_default(settings)
    t_start = time.monotonic()
    pair = _live_pair(model, champion, challenger, s, duration_s, percent)
    window = _mirror_window(pair, s, holder, sleep)
    logged, paired = _pair_with_log(pair, s, window)
    result = _live_predictions(pair, s, window, logged, paired)
    return {**result, "seconds": round(time.monotonic() - t_start, 3)}


def _live_pair(model: str, champion: Any, challenger: Any, s: Settings, duration_s: float | None,
               percent: int | None) -> _LivePair:
    """The checked versions, duration and share of a live shadow (module docstring, step 1)."""
    from tritonflow.pipelines.shadow import as_version_info

    duration = float(s.shadow_live_duration_s if duration_s is None else duration_s)
    share = int(s.shadow_mirror_percent if percent is None else percent)
    if duration <= 0 or not 1 <= share <= 100:
        raise DataError(f"duration_s={duration}, percent={share}; expected duration_s > 0 and an "
                        "integer percent 1-100")
    if challenger in (None, ""):
        raise DataError("live shadow needs a challenger (alias 'challenger' or a version)")
    champ = as_version_info(model, champion, s, "champion")
    chal = as_version_info(model, challenger, s, "challenger")
    if chal["triton_model_name"] != champ["triton_model_name"]:
        raise DataError(f"champion is Triton model {champ['triton_model_name']!r}, challenger "
                        f"{chal['triton_model_name']!r}: the gateway mirrors within one model; use the replay mode")
    return _LivePair(model, champ, chal, duration, share)


def _mirror_window(pair: _LivePair, s: Settings, holder: str, sleep: Callable[[float], Any]) -> _MirrorWindow:
    """Under the promotion lock: the challenger loaded, the mirror on for the window, then all put back.

    Raises:
        DataError: The gateway does not route the model 100 % to the champion without a mirror.
        ChallengerUnavailableError: The challenger could not be loaded.
    """
    from ground.coordination import coordination_store
    from repository_sync.locks import promotion_lock
    from repository_sync.routing.gateway_probe import wait_live
    from repository_sync.routing.mirror import MirrorRecorder
    from repository_sync.routing.traffic_plan import Mirror, TrafficPlan
    from repository_sync.triton.replicas import triton_control
    from tritonflow.pipelines.canary import DEFAULT_LIVE_TIMEOUT_S, CanaryEnvironment, default_holder
    from tritonflow.pipelines.publish_common import s3_endpoint
    from tritonflow.pipelines.shadow import trusted_keys_dir
    from tritonflow.pipelines.shadow_replay import ServedVersion

    name, cver, xver = pair.name, pair.champion_version, pair.challenger_version
    env = CanaryEnvironment.from_settings(s)
    router = env.router()

    def apply_live(plan):
        router.apply(plan)
        wait_live(env.gateway_url, plan, timeout_s=DEFAULT_LIVE_TIMEOUT_S)

    control = triton_control(s, None, repository=s.resolved_repository_uri,
                             trusted_keys=str(trusted_keys_dir(s)), endpoint_url=s3_endpoint(s),
                             load_timeout_s=s.load_timeout_s, coordination=coordination_store(s),
                             holder=holder or default_holder())
    loaded = False
    try:
        with promotion_lock(pair.model, settings=s, holder=holder or default_holder(),
                            timeout_s=s.promotion_lock_timeout_s):
            previous = _champion_only_plan(router, name, cver)
            newly_loaded = loaded = _load_challenger(control, pair)
            output = ServedVersion(control, name, xver).output
            bind = s.shadow_mirror_host if s.shadow_mirror_host in ("127.0.0.1", "localhost") else "0.0.0.0"
            recorder = MirrorRecorder(s.triton_http_url, name, xver, host=bind).start()
            try:
                plan = TrafficPlan.single(name, cver, name=f"{name}:live-shadow",
                                          mirror=Mirror(xver, pair.percent, f"{s.shadow_mirror_host}:{recorder.port}"))
                t0 = time.time()  # before: requests are mirrored while the plan goes live
                apply_live(plan)
                try:
                    sleep(pair.duration_s)
                finally:
                    t1 = time.time()
                    apply_live(previous)  # exactly what routed before
            finally:
                recorder.stop()
            if loaded:
                control.unload_versions(name, [xver])
                loaded = False
    finally:
        if loaded:
            try:
                control.unload_versions(name, [xver])
            except Exception:  # noqa: BLE001 -- the original error is raised
                pass
        control.close()
    return _MirrorWindow(recorder.counters(), _answered(recorder.records()), t0, t1, output, newly_loaded)


def _answered(records: Any) -> Any:
    """The mirrored requests the challenger answered (HTTP 200), its columns prefixed ``mirror.``.

    The prefix keeps them from clashing with the inference log's columns; ``request_id`` is kept
    as it is (the join key).
    """
    if len(records):
        records = records[records["status"] == 200]
    return records.rename(columns={c: f"mirror.{c}" for c in records.columns if c != "request_id"})


def _champion_only_plan(router: Any, name: str, cver: int) -> Any:
    """The live plan, when it routes 100 % of ``name`` to the champion without a mirror.

    Raises:
        DataError: Another plan is live (a canary or another live shadow in progress?).
    """
    previous = router.current_plan(name)
    if previous is None or previous.weights.get(cver) != 100 or previous.mirror is not None:
        live_weights = None if previous is None else previous.weights
        raise DataError(f"live shadow of {name!r} needs the gateway to route 100 % to the "
                        f"champion version {cver} without a mirror; it routes {live_weights} "
                        "(a canary or another live shadow in progress?)")
    return previous


def _load_challenger(control: Any, pair: _LivePair) -> bool:
    """Load the challenger beside the champion unless READY; True when this call loaded it.

    Raises:
        ChallengerUnavailableError: Triton refused it (the champion is untouched).
        TransientError: Triton did not answer.
    """
    if pair.challenger_version in control.ready_versions(pair.name):
        return False
    try:
        control.load(pair.name, pair.challenger_version, keep_loaded=True, purpose="evaluation")
    except TransientError:
        raise
    except DataError as exc:
        raise ChallengerUnavailableError(
            f"challenger {pair.model!r} v{pair.chal['version']} could not be loaded: {exc}; the "
            "champion is untouched") from exc
    return True


def _pair_with_log(pair: _LivePair, s: Settings, window: _MirrorWindow) -> tuple[Any, Any]:
    """``(logged, paired)``: the champion's logged window and its rows joined with the mirrored answers.

    The clients' records of the last requests may land a moment later: the log is read again
    until every mirrored answer is paired or :data:`LOG_GRACE_S` seconds have passed.

    Raises:
        WindowError: No mirrored answer could be paired with a logged request.
    """
    import pandas as pd

    from drift_checks.inference_log import read_window
    from tritonflow.pipelines.publish_common import s3_endpoint
    from tritonflow.pipelines.shadow import log_root

    mirrored = window.mirrored
    start = pd.Timestamp(window.t0, unit="s", tz="UTC")
    end = pd.Timestamp(window.t1 + LOG_GRACE_S, unit="s", tz="UTC")
    deadline = time.monotonic() + LOG_GRACE_S
    while True:
        logged = read_window(log_root(s), pair.model, start, end, endpoint_url=s3_endpoint(s)).frame
        paired = (logged.merge(mirrored, on="request_id", how="inner")
                  if len(mirrored) and len(logged) else logged.iloc[0:0])
        if len(paired) >= len(mirrored) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if paired.empty:
        raise WindowError(
            f"none of the {len(mirrored)} mirrored answers of {pair.model!r} could be paired with a "
            f"logged request in [{start.isoformat()}, {end.isoformat()}) ({len(logged)} logged): "
            "clients must log the request id the gateway returns in X-Request-Id")
    return logged, paired


def _champion_scores(paired: Any, out_cols: list[str], model: str) -> np.ndarray:
    """The champion's scores from its logged output columns (one score, two or C probabilities).

    Raises:
        DataError: The logged outputs give no score.
    """
    import pandas as pd

    from repository_sync.canary.checks import scores_of

    scores = scores_of(paired, out_cols)
    if scores is None and len(out_cols) > 2:  # one logged column per class, in class order
        scores = paired[out_cols].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=np.float64)
    if scores is None:
        raise DataError(f"the inference log of {model!r} has output columns {out_cols}; expected one "
                        "score, two class probabilities or one probability per class to compare with "
                        "the challenger's")
    return scores


def _live_predictions(pair: _LivePair, s: Settings, window: _MirrorWindow, logged: Any,
                      paired: Any) -> dict[str, Any]:
    """Score the pairs, write the predictions, the mirrored answers and the expected predictions."""
    import pandas as pd

    from ground.checksums import sha256_file
    from tritonflow.pipelines.shadow_classes import (
        align,
        check_pair,
        class_columns,
        class_labels_of,
        is_multiclass,
        predictions_frame,
    )
    from tritonflow.pipelines.shadow_replay import OUTPUT_PREFIXES, PREDICTIONS_FILE, new_run_dir, write_expected

    model, champ, chal, output = pair.model, pair.champ, pair.chal, window.output
    out_cols = [c for c in logged.columns if str(c).lower().startswith(OUTPUT_PREFIXES)]
    champion_scores = _champion_scores(paired, out_cols, model)
    challenger_scores = _challenger_scores(paired, output)
    check_pair(champion_scores, challenger_scores, f"live shadow of {model!r}")
    multi: dict[str, Any] = {}
    columns: list[str] = []
    if is_multiclass(champion_scores):
        labels_c = class_labels_of(s, champ)
        challenger_scores = align(labels_c, class_labels_of(s, chal), challenger_scores, f"model {model!r}")
        columns = class_columns(out_cols, champion_scores.shape[1], output)
        multi = {"class_labels": labels_c, "class_columns": columns}
    predictions = predictions_frame(paired, champion_scores, challenger_scores)
    run_dir = new_run_dir(s, model)
    path = run_dir / PREDICTIONS_FILE
    predictions.to_parquet(path, index=False)
    mirrored_path = run_dir / "mirrored.parquet"
    window.mirrored.to_parquet(mirrored_path, index=False)
    expected = write_expected(run_dir, paired[list(logged.columns)], challenger_scores, chal, "live_mirror",
                              columns)
    t0, t1 = window.t0, window.t1
    return {
        **expected,
        **multi,
        "mode": "live",
        "model": model,
        "uri": str(path),
        "sha256": sha256_file(path),
        "bytes": path.stat().st_size,
        "rows": len(predictions),
        "invalid_rows": 0,
        "window_start": pd.Timestamp(t0, unit="s", tz="UTC").floor("us").isoformat(),
        "window_end": pd.Timestamp(t1, unit="s", tz="UTC").ceil("us").isoformat(),
        "champion": champ,
        "challenger": chal,
        "outputs": {"champion": out_cols, "challenger": output},
        "mirror": {**window.counters, "percent": pair.percent, "seconds": round(t1 - t0, 3),
                   "answers_uri": str(mirrored_path)},
        "paired": len(predictions),
        "champion_loaded": False,
        "challenger_loaded": window.newly_loaded,
        "challenger_unloaded": window.newly_loaded,
    }


__all__ = ["LOG_GRACE_S", "live"]
