"""A multi-class classifier through the shadow evaluation and the canary on real services.

Three-class iris classifiers trained on the species *names* (scikit-learn, converted to ONNX,
signed and published with the helpers of ``test_canary_pipeline.py``) are served by a real Triton
behind a real NGINX gateway, registered in the session's MLflow server. The champion (v1) was
trained with its petal columns shuffled, the challenger (v2) on the real rows. The inference log
holds 450 iris requests with the champion's logged probabilities (``probability_0..2``) and, for
four rows in five, the species name as label.

The shadow replay stores both versions' per-class probabilities and the challenger's expected
predictions per class; the comparison maps the names to class indices with the class order read
from the served ONNX files and decides with one-vs-rest AUC, log-loss and accuracy; the canary
then judges the challenger's live probabilities against those expected ones, per class.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from ground.exceptions import DataError
from tests.pipelines.test_canary_pipeline import (  # noqa: F401 - stack is a fixture
    FEATURES,
    PREDICTIONS,
    Traffic,
    _convert,
    deploy,
    promote,
    ready_versions,
    registry,
    stack,
)

pytestmark = pytest.mark.integration

CLASSES = ["setosa", "versicolor", "virginica"]
#: The logged window (450 requests, one a minute) and a second one with an unknown label.
START = pd.Timestamp("2026-03-02T00:00:00Z")
UNKNOWN_START = pd.Timestamp("2026-03-05T00:00:00Z")
REPEATS = 3


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """``weak`` (petal columns shuffled in training), ``strong``, and ``shuffled`` (trained on
    shuffled species: near-uniform probabilities), all on the species names."""
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    X, y = load_iris(return_X_y=True)
    X = X.astype(np.float32)
    names = np.array(CLASSES)[y]
    rng = np.random.default_rng(0)
    noisy = X.copy()
    noisy[:, 2], noisy[:, 3] = rng.permutation(noisy[:, 2]), rng.permutation(noisy[:, 3])
    clf = {
        "weak": LogisticRegression(max_iter=500).fit(noisy, names),
        "strong": LogisticRegression(max_iter=500).fit(X, names),
        "shuffled": LogisticRegression(max_iter=500).fit(X, rng.permutation(names)),
    }
    folder = tmp_path_factory.mktemp("onnx-multiclass")
    out = {k: _convert(c, X, k, folder) for k, c in clf.items()}
    out.update(X=X, names=names, clf=clf, folder=folder)
    return out


def write_log(stack, models, name: str, start: pd.Timestamp, labels: list | None = None) -> pd.DataFrame:
    """Iris rows x REPEATS as logged requests of the champion (``weak``) and labels for 4 in 5."""
    from drift_checks.inference_log import InferenceLogWriter, LogSchema

    X = np.tile(models["X"], (REPEATS, 1))
    species = list(np.tile(models["names"], REPEATS)) if labels is None else labels
    probs = models["clf"]["weak"].predict_proba(X)
    rows = pd.DataFrame(X, columns=FEATURES)
    rows[PREDICTIONS] = probs
    rows.insert(0, "model_version", np.int64(1))
    rows.insert(0, "timestamp", start + pd.to_timedelta(np.arange(len(X)), unit="min"))
    rows.insert(0, "request_id", [f"{name}-{start.day}-{i}" for i in range(len(X))])
    writer = InferenceLogWriter(stack.settings.inference_log_root, name,
                                LogSchema({c: "float" for c in FEATURES}, {c: "float" for c in PREDICTIONS}))
    writer.write(rows)
    keep = np.arange(len(X)) % 5 != 0
    writer.write_labels(pd.DataFrame({
        "request_id": rows["request_id"][keep].to_numpy(),
        "timestamp": pd.to_datetime(rows["timestamp"][keep] + pd.Timedelta(minutes=30), utc=True).to_numpy(),
        "species": np.asarray(species, dtype=object)[keep],
    }).assign(timestamp=lambda f: pd.to_datetime(f["timestamp"], utc=True)))
    return rows.assign(species=species, labelled=keep)


def info(name: str, version: int) -> dict:
    return {"version": version, "triton_model_name": name, "triton_model_version": version,
            "input_columns": FEATURES, "reference_metrics": {}}


@pytest.fixture(scope="module")
def shadow(stack, models):
    """v1 ``weak`` champion serving, v2 ``strong`` challenger in the repository; one replay."""
    from tritonflow.pipelines.shadow_compare import compare
    from tritonflow.pipelines.shadow_replay import replay

    name = "iris_shadow"
    deploy(stack, models, name, {1: "weak", 2: "strong"})
    logged = write_log(stack, models, name, START)
    settings = dataclasses.replace(stack.settings, mlflow_tracking_uri=stack.tracking_uri)
    end = START + pd.Timedelta(days=1)
    replayed = replay(name, info(name, 1), info(name, 2), START, end, settings=settings, concurrency=2)
    decision = compare(replayed, settings=settings, record=False, rule_overrides={"confidence": 0.99})
    return {"name": name, "logged": logged, "replayed": replayed, "decision": decision, "settings": settings}


def test_replay_stores_per_class_probabilities_in_the_served_class_order(stack, models, shadow):
    replayed, logged = shadow["replayed"], shadow["logged"]
    assert replayed["rows"] == len(logged) and replayed["invalid_rows"] == 0
    assert replayed["class_labels"] == CLASSES  # from the served ONNX classifier node
    assert replayed["class_columns"] == PREDICTIONS  # the log's own output columns
    assert replayed["challenger_loaded"] and replayed["challenger_unloaded"]
    assert ready_versions(stack, shadow["name"]) == [1]
    preds = pd.read_parquet(replayed["uri"]).set_index("request_id").loc[logged["request_id"]]
    X = logged[FEATURES].to_numpy(np.float32)
    for role, key in (("champion", "weak"), ("challenger", "strong")):
        truth = models["clf"][key].predict_proba(X)  # Triton's answers are the models' own
        got = preds[[f"{role}_proba_{c}" for c in range(3)]].to_numpy()
        np.testing.assert_allclose(got, truth, atol=1e-5)
        np.testing.assert_array_equal(preds[f"{role}_score"], truth.argmax(axis=1))
    expected = pd.read_parquet(replayed["expected_uri"]).set_index("request_id").loc[logged["request_id"]]
    np.testing.assert_allclose(expected[[f"expected.{c}" for c in PREDICTIONS]].to_numpy(),
                               models["clf"]["strong"].predict_proba(X), atol=1e-5)
    assert list(expected[FEATURES].columns) == FEATURES and set(expected["source"]) == {"shadow_replay"}


def test_comparison_uses_the_multiclass_task_with_string_labels_mapped_to_classes(models, shadow):
    from sklearn.metrics import accuracy_score, log_loss, roc_auc_score

    decision, logged = shadow["decision"], shadow["logged"]
    assert decision["verdict"] == "challenger_wins" and decision["outcome"] == "promote_challenger"
    assert decision["n_labelled"] == int(logged["labelled"].sum())
    evidence = json.loads(open(decision["evidence_uri"]).read())
    assert evidence["rule"]["task"] == "multiclass" and evidence["rule"]["primary_metric"] == "auc_ovr"
    assert evidence["class_labels"] == CLASSES
    rows = logged[logged["labelled"]]
    y = pd.Categorical(rows["species"], categories=CLASSES).codes
    X = rows[FEATURES].to_numpy(np.float32)
    for role, key in (("champion", "weak"), ("challenger", "strong")):
        p = models["clf"][key].predict_proba(X)
        want = {"auc_ovr": roc_auc_score(y, p, multi_class="ovr"), "log_loss": log_loss(y, p),
                "accuracy": accuracy_score(y, p.argmax(axis=1))}
        for metric, value in want.items():
            assert evidence["comparisons"][metric][role] == pytest.approx(value, abs=1e-4), (role, metric)
    primary = decision["primary"]
    assert primary["name"] == "auc_ovr" and primary["ci_low"] >= 0.01  # lower 99 % bound >= margin
    assert evidence["comparisons"]["log_loss"]["ci_low"] > 0  # log-loss dropped, with confidence
    print("MULTICLASS_SHADOW", json.dumps({m: {k: evidence["comparisons"][m][k] for k in
                                               ("champion", "challenger", "ci_low", "ci_high")}
                                           for m in ("auc_ovr", "log_loss", "accuracy")}))


def test_a_label_that_is_not_one_of_the_models_classes_is_named(stack, models, shadow):
    from tritonflow.pipelines.shadow_compare import compare
    from tritonflow.pipelines.shadow_replay import replay

    name = shadow["name"]
    species = list(np.tile(models["names"], REPEATS))
    species[7] = "Iris-setosa"  # another naming of the classes in the label feed
    write_log(stack, models, name, UNKNOWN_START, labels=species)
    end = UNKNOWN_START + pd.Timedelta(days=1)
    replayed = replay(name, info(name, 1), info(name, 2), UNKNOWN_START, end, settings=shadow["settings"])
    with pytest.raises(DataError, match=r"'Iris-setosa' is not a class of the model; known classes.*"
                                        r"\['setosa', 'versicolor', 'virginica'\]"):
        compare(replayed, settings=shadow["settings"], record=False)


def test_canary_judges_the_challenger_per_class_against_its_shadow_predictions(stack, models, shadow):
    """The shadow's expected file feeds the canary: the challenger serving as evaluated passes,
    column by column and per class; a different artifact under the same evaluation fails, the
    reason naming the class whose predicted share moved."""
    expected_uri = shadow["decision"]["canary_conf"]["expected_predictions"]
    name = shadow["name"]
    with Traffic(stack, name, models["X"]):
        result = promote(stack, name, 2, expected_predictions=expected_uri)
    assert result["outcome"] == "promoted", result
    tags = registry(stack).get_version(name, 2).tags
    prefix = f"tritonflow.canary.{result['canary_id']}.step."
    judged = [json.loads(v) for k, v in tags.items() if k.startswith(prefix)]
    judged = [s for s in judged if s["verdict"] == "pass" and s["prediction_checks"]]
    assert judged, [json.loads(v)["reasons"] for k, v in tags.items() if k.startswith(prefix)]
    step = judged[0]
    assert {c["column"] for c in step["prediction_checks"]} == set(PREDICTIONS)
    classes = step["prediction_classes"]
    assert classes["columns"] == PREDICTIONS and classes["matched_on_inputs"] is True
    assert [r["column"] for r in classes["per_class"]] == PREDICTIONS

    wrong = "iris_shadow_wrong"
    deploy(stack, models, wrong, {1: "weak", 2: "shuffled"})  # v2 serves another artifact
    with Traffic(stack, wrong, models["X"]):
        result = promote(stack, wrong, 2, expected_predictions=expected_uri)
    assert result["outcome"] == "rolled_back", result
    tags = registry(stack).get_version(wrong, 2).tags
    prefix = f"tritonflow.canary.{result['canary_id']}.step."
    failed = [s for s in (json.loads(v) for k, v in tags.items() if k.startswith(prefix)) if s["verdict"] == "fail"]
    assert failed and failed[-1]["prediction_classes"]["max_ks"] > 0.2, failed
    assert any(r.startswith("class probability_") and "moved most" in r for r in failed[-1]["reasons"]), failed
    print("MULTICLASS_CANARY", json.dumps({"pass": step["prediction_classes"]["per_class"],
                                           "fail": failed[-1]["prediction_classes"]["per_class"]}))


def test_live_shadow_pairs_per_class_probabilities_of_mirrored_requests(stack, models):
    """The live mode on the same model kind: the gateway mirrors the champion's requests, the
    logged ``probability_0..2`` of the champion and the challenger's mirrored ``probabilities``
    are stored per class, and the comparison is a multi-class one (no label yet: inconclusive)."""
    from tritonflow.pipelines.shadow_compare import compare
    from tritonflow.pipelines.shadow_live import live

    name = "iris_live"
    deploy(stack, models, name, {1: "weak", 2: "strong"})
    settings = dataclasses.replace(stack.settings, mlflow_tracking_uri=stack.tracking_uri)
    with Traffic(stack, name, models["X"]):
        shadow = live(name, info(name, 1), info(name, 2), settings=settings, duration_s=4, percent=100)
    assert shadow["paired"] >= 10 and shadow["class_labels"] == CLASSES
    assert shadow["class_columns"] == PREDICTIONS
    pairs = pd.read_parquet(shadow["uri"])
    expected = pd.read_parquet(shadow["expected_uri"])
    X = expected[FEATURES].to_numpy(np.float32)
    for role, key in (("champion", "weak"), ("challenger", "strong")):
        got = pairs[[f"{role}_proba_{c}" for c in range(3)]].to_numpy()
        np.testing.assert_allclose(got, models["clf"][key].predict_proba(X), atol=1e-5)
    np.testing.assert_allclose(expected[[f"expected.{c}" for c in PREDICTIONS]].to_numpy(),
                               models["clf"]["strong"].predict_proba(X), atol=1e-5)
    assert ready_versions(stack, name) == [1]
    decision = compare(shadow, settings=settings, record=False)
    assert decision["verdict"] == "inconclusive"
    assert json.loads(open(decision["evidence_uri"]).read())["rule"]["task"] == "multiclass"
