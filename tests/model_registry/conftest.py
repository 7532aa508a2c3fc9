"""Fixtures rebuilding the case inputs for model_registry tests."""

from __future__ import annotations

import io

import numpy as np
import pytest

from ground.settings import Settings

TRAIN_20_CSV = """tenure_months,monthly_fee,support_calls,churned
16,56.41,2,0
24,82.28,7,1
41,55.47,0,0
59,76.0,4,0
36,27.75,7,0
35,75.92,7,0
26,60.13,2,0
15,59.79,6,1
48,10.21,1,0
11,69.66,0,0
20,71.41,4,1
31,56.58,6,0
46,72.05,6,0
26,67.25,7,0
60,19.73,5,0
7,11.87,7,1
14,29.64,6,1
50,59.13,4,0
27,49.58,6,0
37,37.07,6,0
"""
FEATURES = ["tenure_months", "monthly_fee", "support_calls"]


@pytest.fixture
def settings() -> Settings:
    """Settings with defaults only (the environment is ignored)."""
    return Settings.from_env({})


@pytest.fixture
def churn_head_model():
    """A fixed-shape model (make_model.py): features[batch,12] -> probabilities[batch,2], IR 8, opset 17."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.normal(size=(12, 2)).astype(np.float32), "w")
    b = numpy_helper.from_array(np.zeros(2, dtype=np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["features", "w"], ["z0"]),
         helper.make_node("Add", ["z0", "b"], ["z1"]),
         helper.make_node("Softmax", ["z1"], ["probabilities"], axis=1)],
        "churn_head",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 12])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 2])],
        initializer=[w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _tiny_cnn(batch_dim):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(11)
    w = numpy_helper.from_array(rng.normal(size=(3072, 10)).astype(np.float32), "w")
    shape_const = numpy_helper.from_array(np.array([1, 3072], dtype=np.int64), "flat_shape")
    g = helper.make_graph(
        [helper.make_node("Reshape", ["images", "flat_shape"], ["flat"]),
         helper.make_node("MatMul", ["flat", "w"], ["logits"])],
        "tiny_cnn_head",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [batch_dim, 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch_dim, 10])],
        initializer=[w, shape_const])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


@pytest.fixture
def fixed_batch_model():
    """input declared with a fixed batch of 1 ([1,3,32,32])."""
    return _tiny_cnn(1)


@pytest.fixture
def baked_reshape_model():
    """symbolic batch axis "N" but a Reshape to the constant [1, 3072]."""
    return _tiny_cnn("N")


@pytest.fixture
def images_sample():
    """Four seeded images [4,3,32,32] float32."""
    return {"images": np.random.default_rng(0).normal(size=(4, 3, 32, 32)).astype(np.float32)}


@pytest.fixture
def reco_ranker_model():
    """Integer id inputs (model_io.json): user_id, item_id int64 [batch,1] -> score float [batch,1]."""
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Cast", ["user_id"], ["u"], to=TensorProto.FLOAT),
         helper.make_node("Cast", ["item_id"], ["i"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["u", "i"], ["p"]),
         helper.make_node("Sigmoid", ["p"], ["score"])],
        "reco_ranker",
        [helper.make_tensor_value_info("user_id", TensorProto.INT64, ["batch", 1]),
         helper.make_tensor_value_info("item_id", TensorProto.INT64, ["batch", 1])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch", 1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


@pytest.fixture
def train_20():
    """Training rows (train_20.csv): (X float32 [20,3], y int [20], DataFrame)."""
    import pandas as pd

    df = pd.read_csv(io.StringIO(TRAIN_20_CSV))
    return df[FEATURES].astype("float32").to_numpy(), df["churned"].to_numpy(), df


@pytest.fixture
def churn_classifier(train_20):
    """LogisticRegression fitted on train_20 (as in convert_default.py)."""
    from sklearn.linear_model import LogisticRegression

    x, y, _ = train_20
    return LogisticRegression(max_iter=1000).fit(x, y)


# ----------------------------------------------------------------- registry client (registry.py)
@pytest.fixture(scope="module")
def registry_tracking_uri(mlflow_server) -> str:
    """Tracking URI of the shared real MLflow server (tests/conftest.py ``mlflow_server``)."""
    return mlflow_server.tracking_uri


@pytest.fixture(scope="module")
def logged_sklearn_model(registry_tracking_uri):
    """One small scikit-learn classifier logged once with a signature and an input example.

    Yields a dict with ``model_uri`` (``models:/m-...``), ``run_id``, ``model_id``, ``X`` (the
    training frame) and ``model``. ``pip_requirements`` is given so MLflow skips its slow
    requirements inference.
    """
    import mlflow
    import pandas as pd
    from mlflow.models import infer_signature
    from sklearn.linear_model import LogisticRegression

    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(registry_tracking_uri)
    rng = np.random.default_rng(7)
    X = pd.DataFrame({"temp": rng.normal(size=40), "pressure": rng.normal(size=40)})
    y = (X["temp"] + 0.5 * X["pressure"] > 0).astype(int)
    model = LogisticRegression().fit(X, y)
    try:
        with mlflow.start_run() as run:
            info = mlflow.sklearn.log_model(
                model,
                name="model",
                signature=infer_signature(X, model.predict_proba(X)),
                input_example=X.head(3),
                pip_requirements=["scikit-learn"],
            )
        yield {"model_uri": info.model_uri, "run_id": run.info.run_id, "model_id": info.model_id,
               "X": X, "model": model}
    finally:
        mlflow.set_tracking_uri(previous)


@pytest.fixture(scope="module")
def register_versions(registry_tracking_uri, logged_sklearn_model):
    """``register_versions(n, prefix="m")`` -> a fresh registered model name with ``n`` READY versions.

    All versions point at the same logged model (registration is what the tests exercise).
    """
    import uuid

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=registry_tracking_uri)

    def make(n: int, prefix: str = "m") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        client.create_registered_model(name)
        for _ in range(n):
            client.create_model_version(
                name, source=logged_sklearn_model["model_uri"], run_id=logged_sklearn_model["run_id"],
                model_id=logged_sklearn_model["model_id"],
            )
        return name

    return make
