"""Fixtures of the repository_sync tests: signing keys, a small sklearn model converted to ONNX
and its config.pbtxt (built with protobuf), and staged version folders."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from repository_sync.signing import generate_key_pair


@dataclass
class Keys:
    private: Path
    public: Path
    trusted_dir: Path
    key_id: str


@pytest.fixture(scope="session")
def signing_keys(tmp_path_factory) -> Keys:
    """A fresh ECDSA P-256 key pair; the public key is alone in its trusted-keys folder."""
    base = tmp_path_factory.mktemp("keys")
    key_id = generate_key_pair(base / "signing.pem", base / "trusted" / "current.pub")
    return Keys(base / "signing.pem", base / "trusted" / "current.pub", base / "trusted", key_id)


@pytest.fixture(scope="session")
def other_keys(tmp_path_factory) -> Keys:
    """A second, unrelated key pair (an attacker's or a retired key)."""
    base = tmp_path_factory.mktemp("other-keys")
    key_id = generate_key_pair(base / "signing.pem", base / "trusted" / "other.pub")
    return Keys(base / "signing.pem", base / "trusted" / "other.pub", base / "trusted", key_id)


@dataclass
class SklearnOnnx:
    clf: object
    onnx_path: Path
    X: np.ndarray
    config_text: str
    model_name: str = "iris_clf"


def make_config_text(name: str, n_features: int, n_classes: int, max_batch_size: int = 16) -> str:
    """config.pbtxt of an skl2onnx classifier without ZipMap, built with protobuf."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as pb

    cfg = pb.ModelConfig(name=name, backend="onnxruntime", max_batch_size=max_batch_size)
    cfg.input.add(name="float_input", data_type=pb.TYPE_FP32, dims=[n_features])
    label = cfg.output.add(name="label", data_type=pb.TYPE_INT64, dims=[1])
    label.reshape.SetInParent()  # the model's label is rank 1 [batch]: reshape to shape []
    cfg.output.add(name="probabilities", data_type=pb.TYPE_FP32, dims=[n_classes])
    cfg.instance_group.add(kind=pb.ModelInstanceGroup.KIND_CPU, count=1)
    return text_format.MessageToString(cfg)


@pytest.fixture(scope="session")
def sklearn_onnx(tmp_path_factory) -> SklearnOnnx:
    """A logistic regression on iris converted with skl2onnx (zipmap disabled)."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    X, y = load_iris(return_X_y=True)
    X = X.astype(np.float32)
    clf = LogisticRegression(max_iter=500).fit(X, y)
    onx = convert_sklearn(
        clf,
        initial_types=[("float_input", FloatTensorType([None, X.shape[1]]))],
        options={id(clf): {"zipmap": False}},
        target_opset=17,
    )
    path = tmp_path_factory.mktemp("onnx") / "iris.onnx"
    path.write_bytes(onx.SerializeToString())
    return SklearnOnnx(clf, path, X, make_config_text("iris_clf", X.shape[1], 3))
