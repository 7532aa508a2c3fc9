"""Promotion and rollback time with 2 Triton replicas against 1, on one S3 (moto) repository.

Real Triton processes (explicit model control) read one moto S3 repository holding signed
versions 1 and 2 of a small ONNX classifier (4 features -> 2 probabilities). The model-control
steps of a canary are timed through :func:`repository_sync.model_control.reconcile` -- the path
``canary_loading``, ``canary_promotion`` and ``canary_rollback`` take -- once with a plain
:class:`~repository_sync.triton_client.TritonModelControl` on one replica and once with a
:class:`~repository_sync.triton_replicas.TritonReplicaSet` over two:

* **promotion**: challenger 2 loaded beside champion 1 (signature verified, READY awaited), then
  the old champion 1 unloaded (only 2 left);
* **rollback**: version 1 loaded back beside 2, then 2 unloaded (only 1 left).

Each cycle is repeated ``--repeats`` times; medians and maxima in seconds. The replicas are
changed one after the other (each READY before the next), so the 2-replica time is expected near
twice the 1-replica Triton time plus one verification.

Usage::

    .venv/bin/python benchmarks/replica_promotion.py [--repeats 5]

Last line: the standard JSON object (:mod:`benchmarks.report`; no stated goal) with
``one_replica`` / ``two_replicas`` (``promotion_s`` and ``rollback_s`` medians and maxima),
``ratio_promotion``, ``ratio_rollback``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ground.coordination import CoordinationStore  # noqa: E402
from ground.settings import Settings  # noqa: E402
from repository_sync.model_control import reconcile  # noqa: E402
from repository_sync.triton_client import TritonModelControl  # noqa: E402
from repository_sync.triton_replicas import TritonReplicaSet  # noqa: E402
from tritonflow.runtime.services import S3Server, TritonServer, free_port  # noqa: E402

NAME = "bench_replicas"
CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
default_model_filename: "model.onnx"
input [ {{ name: "features" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "probabilities" data_type: TYPE_FP32 dims: [ 2 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""


def _settings(home: Path) -> Settings:
    ports = {k: free_port() for k in ("triton_http_port", "triton_grpc_port", "triton_metrics_port",
                                       "mlflow_port", "s3_port", "gateway_port")}
    return Settings.from_env({}, home=home, **ports)


def _onnx(path: Path, seed: int) -> Path:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(seed).normal(size=(4, 2)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["features", "w"], ["logits"]),
         helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1)],
        "bench", [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 2])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


def _cycle(control, repeats: int) -> dict:
    """Time promotion (1 -> 2) and rollback (2 -> 1) ``repeats`` times; starts and ends on {1}."""
    reconcile(control, NAME, exactly=[1])
    promo, back = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        reconcile(control, NAME, add=[2], config_version=2, purpose="canary")
        reconcile(control, NAME, remove=[1], config_version=2)
        promo.append(time.perf_counter() - t)
        t = time.perf_counter()
        reconcile(control, NAME, add=[1], config_version=1)
        reconcile(control, NAME, remove=[2], config_version=1)
        back.append(time.perf_counter() - t)
    return {"promotion_s": round(statistics.median(promo), 3), "promotion_max_s": round(max(promo), 3),
            "rollback_s": round(statistics.median(back), 3), "rollback_max_s": round(max(back), 3)}


def main() -> None:
    """Run the benchmark; print progress, then one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import boto3

    from repository_sync.publish import publish_version
    from repository_sync.signing import generate_key_pair

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "tritonflow-bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "tritonflow-bench-secret")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    with tempfile.TemporaryDirectory(prefix="tritonflow-replicas-") as tmp_name:
        tmp = Path(tmp_name)
        generate_key_pair(tmp / "signing.pem", tmp / "trusted" / "bench.pub")
        s3 = S3Server(_settings(tmp / "s3")).start()
        tritons: list[TritonServer] = []
        try:
            bucket = f"replicas-{uuid.uuid4().hex[:8]}"
            boto3.client("s3", endpoint_url=s3.endpoint_url).create_bucket(Bucket=bucket)
            repo = s3.triton_url(bucket, "triton")
            for v in (1, 2):
                publish_version(repository=repo, model_name=NAME, version=v, model_file=_onnx(tmp / f"{v}.onnx", v),
                                config=CONFIG.format(name=NAME), private_key=tmp / "signing.pem",
                                trusted_keys=tmp / "trusted", endpoint_url=s3.endpoint_url)
            for i in range(2):
                tritons.append(TritonServer(_settings(tmp / f"triton{i}"), repository=repo).start())
            urls = [t.http_url for t in tritons]
            common = dict(repository=repo, trusted_keys=tmp / "trusted", endpoint_url=s3.endpoint_url,
                          load_timeout_s=60, holder="benchmark")
            results = {}
            store = CoordinationStore(f"sqlite:///{tmp / 'one.db'}")
            with TritonModelControl(urls[0], coordination=store, **common) as one:  # type: ignore[arg-type]
                results["one_replica"] = _cycle(one, args.repeats)
                reconcile(one, NAME, exactly=())
            print(f"1 replica: {json.dumps(results['one_replica'])}", flush=True)
            store = CoordinationStore(f"sqlite:///{tmp / 'two.db'}")
            with TritonReplicaSet(urls, coordination=store, **common) as two:  # type: ignore[arg-type]
                results["two_replicas"] = _cycle(two, args.repeats)
            print(f"2 replicas: {json.dumps(results['two_replicas'])}", flush=True)
        finally:
            for t in tritons:
                t.stop()
            s3.stop()
    results.update(
        repeats=args.repeats, repository="moto S3", model="ONNX MatMul+Softmax, 4 -> 2, KIND_CPU",
        ratio_promotion=round(results["two_replicas"]["promotion_s"] / results["one_replica"]["promotion_s"], 2),
        ratio_rollback=round(results["two_replicas"]["rollback_s"] / results["one_replica"]["rollback_s"], 2),
    )
    from report import finish

    finish("replica_promotion",
           f"Model control of a promotion and of a rollback (load beside, verify, READY, unload) on 2 real Triton "
           f"replicas against 1, one moto S3 repository, median of {args.repeats}; no stated goal.",
           {}, **results)


if __name__ == "__main__":
    main()
