"""Model Analyzer profile config, perf_analyzer flags, results and stability."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ground.exceptions import MeasurementUnstableError, ProfilingError, ToolingError
from model_registry.hardware import GpuInfo, HardwareInventory
from model_registry.profiling.analyzer import confirmation_repository
from model_registry.profiling.analyzer_config import (
    SearchSpace,
    build_profile_config,
    check_profile_config,
    perf_analyzer_argv,
    shape_flags,
    write_profile_config,
)
from model_registry.profiling.analyzer_results import (
    ProfileRow,
    choose_best,
    read_perf_passes,
    read_results_csv,
    stability,
    unstable_configs_from_log,
)
from model_registry.triton_config import parse_config

CPU_HOST = HardwareInventory((), False, "NVML unavailable (no NVIDIA driver/GPU)", 8 << 30, 4 << 30, 2)
GPU_HOST = HardwareInventory((GpuInfo(0, "Tesla T4", "GPU-x", 16 << 30, 15 << 30, (7, 5)),), True, "",
                             8 << 30, 4 << 30, 2)

CPU_ONLY_MODEL_CONFIG = """
name: "tabular_cpu"
platform: "onnxruntime_onnx"
max_batch_size: 32
input [ { name: "features" data_type: TYPE_FP32 dims: [ 24 ] } ]
output [ { name: "probabilities" data_type: TYPE_FP32 dims: [ 2 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
"""
NAIVE_CPU_ONLY_ANALYZER_YAML = """
model_repository: /models
triton_launch_mode: remote
triton_grpc_endpoint: 127.0.0.1:8001
profile_models:
  - tabular_cpu
"""
EXPECTED_CPU_ONLY_ANALYZER_YAML = """
model_repository: /models
triton_launch_mode: remote
triton_grpc_endpoint: 127.0.0.1:8001
collect_cpu_metrics: true
profile_models:
  tabular_cpu:
    cpu_only: true
"""
VARIABLE_DIMS_COLON_NAME_CONFIG = """
name: "ticket_classifier"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [
  { name: "input_ids"       data_type: TYPE_INT64 dims: [ -1 ] },
  { name: "attention_mask"  data_type: TYPE_INT64 dims: [ -1 ] },
  { name: "onnx::Cast_2"    data_type: TYPE_INT64 dims: [ -1 ] }
]
output [ { name: "logits" data_type: TYPE_FP32 dims: [ 5 ] } ]
"""
NAIVE_ONE_STRING_SHAPE_ANALYZER_YAML = """
profile_models:
  ticket_classifier:
    perf_analyzer_flags:
      shape: "input_ids:128 attention_mask:128 onnx::Cast_2:128"
"""
EXPECTED_SHAPE_LIST_ANALYZER_YAML = """
profile_models:
  ticket_classifier:
    perf_analyzer_flags:
      shape:
        - input_ids:128
        - attention_mask:128
        - token_type_ids:128
"""
COLLAPSING_AND_STEADY_PASSES = """config,concurrency,pass,throughput_infer_per_s,avg_latency_us,latency_std_us
tabular_cpu_config_2,4,1,1312.4,3021,2110
tabular_cpu_config_2,4,2,1288.9,3102,2350
tabular_cpu_config_2,4,3,1301.7,3066,9870
tabular_cpu_config_2,4,4,61.2,64880,91004
tabular_cpu_config_2,4,5,58.7,67412,80211
tabular_cpu_config_2,4,6,212.5,18890,40112
tabular_cpu_config_2,4,7,57.9,68100,120443
tabular_cpu_config_2,4,8,60.3,66020,99120
tabular_cpu_config_2,4,9,59.1,67333,101887
tabular_cpu_config_2,4,10,61.8,64009,97650
tabular_cpu_config_3,4,1,842.0,4731,610
tabular_cpu_config_3,4,2,839.6,4745,598
tabular_cpu_config_3,4,3,845.1,4712,602
"""
# Model Analyzer's results table as it would report the first (fast) pass of each config.
MA_RESULTS = (
    "Model,Batch,Concurrency,Model Config Path,Instance Group,Max Batch Size,Satisfies Constraints,"
    "Throughput (infer/sec),p99 Latency (ms)\n"
    """tabular_cpu,1,4,tabular_cpu_config_2,2:CPU,32,Yes,1312.4,9.8
tabular_cpu,1,4,tabular_cpu_config_3,1:CPU,16,Yes,842.0,5.1
tabular_cpu,1,4,tabular_cpu_config_4,4:CPU,32,No,900.0,250.0
"""
)


def _profile(tmp_path, config, **kw):
    return build_profile_config(
        config.name, config, model_repository=tmp_path / "repo", output_model_repository=tmp_path / "out",
        export_path=tmp_path / "export", **kw)


# ------------------------------------------------------------------------------------ CPU-only hosts
def test_cpu_only_host_gets_cpu_only_and_only_kind_cpu_configs(tmp_path, settings):
    cfg = parse_config(CPU_ONLY_MODEL_CONFIG)
    search = SearchSpace(max_batch_sizes=(8, 32), instance_counts=(1, 2), queue_delays_us=(100,), concurrency=(4,))
    profile = _profile(tmp_path, cfg, hardware=CPU_HOST, search=search, settings=settings,
                       triton_server_path="/x/tritonserver", perf_analyzer_path="/x/perf_analyzer")
    entry = profile["profile_models"]["tabular_cpu"]
    assert profile["triton_launch_mode"] == "local" and profile["collect_cpu_metrics"] is True
    assert profile["triton_server_path"] == "/x/tritonserver" and profile["perf_analyzer_path"] == "/x/perf_analyzer"
    assert entry["cpu_only"] is True
    kinds = {g["kind"] for g in entry["model_config_parameters"]["instance_group"]}
    assert kinds == {"KIND_CPU"}
    assert entry["model_config_parameters"]["max_batch_size"] == [8, 32]
    assert profile["run_config_search_disable"] is True
    assert profile["constraints"] == {"perf_latency_p99": {"max": settings.analyzer_p99_latency_ms}}
    assert search.n_configs(batching=True) == 4
    written = yaml.safe_load(write_profile_config(profile, tmp_path / "p.yaml").read_text())
    assert written == profile and check_profile_config(written, {"tabular_cpu": cfg}, has_gpu=False) == []


def test_gpu_host_profile_searches_kind_gpu(tmp_path, settings):
    profile = _profile(tmp_path, parse_config(CPU_ONLY_MODEL_CONFIG), hardware=GPU_HOST, settings=settings)
    entry = profile["profile_models"]["tabular_cpu"]
    assert entry["cpu_only"] is False
    assert entry["model_config_parameters"]["instance_group"][0]["kind"] == "KIND_GPU"
    assert "duration_seconds" not in profile  # the server-only GPU monitors get Model Analyzer's 3 s


def test_model_analyzers_triton_exits_at_once_and_skips_gpu_monitoring_on_a_cpu_host(tmp_path, settings):
    """Model Analyzer stops its Triton with its own client still connected: at Triton's default
    exit timeout (30 s) every stop waited out Model Analyzer's 5 s kill, once per config."""
    from model_registry.profiling.analyzer_config import SCRATCH_EXIT_TIMEOUT_S

    profile = _profile(tmp_path, parse_config(CPU_ONLY_MODEL_CONFIG), hardware=CPU_HOST, settings=settings,
                       backend_directory="/x/backends")
    assert profile["triton_server_flags"] == {"exit-timeout-secs": SCRATCH_EXIT_TIMEOUT_S,
                                              "backend-directory": "/x/backends"}
    assert SCRATCH_EXIT_TIMEOUT_S <= 2 and profile["duration_seconds"] == 1
    bare = _profile(tmp_path, parse_config(CPU_ONLY_MODEL_CONFIG), hardware=CPU_HOST, settings=settings)
    assert bare["triton_server_flags"] == {"exit-timeout-secs": SCRATCH_EXIT_TIMEOUT_S}


def test_gpu_profiling_requested_on_a_cpu_only_host_is_refused(tmp_path, settings):
    with pytest.raises(ProfilingError, match="'tabular_cpu'.*no GPU"):
        _profile(tmp_path, parse_config(CPU_ONLY_MODEL_CONFIG), hardware=CPU_HOST, cpu_only=False, settings=settings)


def test_naive_cpu_only_analyzer_config_is_flagged_and_expected_one_passes():
    naive = check_profile_config(yaml.safe_load(NAIVE_CPU_ONLY_ANALYZER_YAML), has_gpu=False)
    assert any("collect_cpu_metrics" in p for p in naive)
    assert any("'tabular_cpu': cpu_only is not true" in p for p in naive)
    assert check_profile_config(yaml.safe_load(EXPECTED_CPU_ONLY_ANALYZER_YAML), has_gpu=False) == []


def test_no_measured_candidate_fails_profiling_naming_the_model(settings):
    with pytest.raises(ProfilingError, match="'tabular_cpu'.*no configuration was measured"):
        choose_best([], model_name="tabular_cpu", settings=settings)


# ------------------------------------------------------------------------------------ tensor names and shapes
def test_tensor_name_with_colon_stops_profiling_before_it_starts(tmp_path, settings):
    with pytest.raises(ProfilingError, match="'onnx::Cast_2'"):
        _profile(tmp_path, parse_config(VARIABLE_DIMS_COLON_NAME_CONFIG), hardware=CPU_HOST, shapes={"input_ids": 128},
                 settings=settings)


def test_variable_input_without_shape_is_refused_naming_it(settings):
    cfg = parse_config(VARIABLE_DIMS_COLON_NAME_CONFIG.replace("onnx::Cast_2", "token_type_ids"))
    with pytest.raises(ProfilingError, match="'attention_mask' has variable dims"):
        shape_flags(cfg, {"input_ids": [128]})


def _renamed_inputs_profile(tmp_path, settings):
    # after the converter's rename
    cfg = parse_config(VARIABLE_DIMS_COLON_NAME_CONFIG.replace("onnx::Cast_2", "token_type_ids"))
    shapes = {"input_ids": [128], "attention_mask": [128], "token_type_ids": 128}
    return _profile(tmp_path, cfg, hardware=CPU_HOST, shapes=shapes, settings=settings), cfg


def test_one_shape_entry_per_variable_input_as_a_yaml_list(tmp_path, settings):
    profile, cfg = _renamed_inputs_profile(tmp_path, settings)
    path = write_profile_config(profile, tmp_path / "profile.yaml")
    flags = yaml.safe_load(path.read_text())["profile_models"]["ticket_classifier"]["perf_analyzer_flags"]
    expected_profile = yaml.safe_load(EXPECTED_SHAPE_LIST_ANALYZER_YAML)
    expected = expected_profile["profile_models"]["ticket_classifier"]["perf_analyzer_flags"]
    assert flags["shape"] == expected["shape"]
    argv = perf_analyzer_argv("ticket_classifier", flags)
    shapes = [a for a in argv if a.startswith("--shape")]
    assert shapes == ["--shape=input_ids:128", "--shape=attention_mask:128", "--shape=token_type_ids:128"]


def test_naive_analyzer_config_is_flagged_for_string_shape_and_colon_name():
    problems = check_profile_config(yaml.safe_load(NAIVE_ONE_STRING_SHAPE_ANALYZER_YAML),
                                    {"ticket_classifier": parse_config(VARIABLE_DIMS_COLON_NAME_CONFIG)}, has_gpu=True)
    assert any("is one string" in p for p in problems)
    assert any("'onnx::Cast_2'" in p and "contains ':'" in p for p in problems)
    with pytest.raises(ProfilingError, match="one string"):
        perf_analyzer_argv("m", {"shape": "input_ids:128 attention_mask:128"})


@pytest.mark.skipif(not (Path(sys.prefix).parent / ".venv-triton" / "bin" / "python").exists(),
                    reason="Triton tools environment (.venv-triton) not installed")
def test_model_analyzers_own_perf_config_emits_exactly_three_shape_flags(tmp_path, settings):
    profile, _ = _renamed_inputs_profile(tmp_path, settings)
    path = write_profile_config(profile, tmp_path / "profile.yaml")
    code = (
        "import json, sys, yaml\n"
        "from model_analyzer.perf_analyzer.perf_config import PerfAnalyzerConfig\n"
        "p = yaml.safe_load(open(sys.argv[1]))['profile_models']['ticket_classifier']\n"
        "c = PerfAnalyzerConfig(); c['model-name'] = 'ticket_classifier'\n"
        "c.update_config(p['perf_analyzer_flags'])\n"
        "print(json.dumps(c.to_cli_string().split()))\n"
    )
    py = Path(sys.prefix).parent / ".venv-triton" / "bin" / "python"
    out = subprocess.run([str(py), "-c", code, str(path)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    argv = json.loads(out.stdout.strip().splitlines()[-1])
    assert [a for a in argv if a.startswith("--shape")] == [
        "--shape=input_ids:128", "--shape=attention_mask:128", "--shape=token_type_ids:128"]


# ------------------------------------------------------------------------------------ unstable measurements
def test_unstable_config_is_dropped_and_the_stable_one_chosen(settings):
    passes = read_perf_passes(COLLAPSING_AND_STEADY_PASSES)
    stab = stability(passes, settings=settings)
    assert stab["tabular_cpu_config_2"].cv == pytest.approx(1.25, abs=0.01)
    assert stab["tabular_cpu_config_2"].mean == pytest.approx(447.45, abs=0.01)
    assert not stab["tabular_cpu_config_2"].stable and stab["tabular_cpu_config_3"].stable
    rows = [r for r in read_results_csv(MA_RESULTS) if r.config != "tabular_cpu_config_4"]
    naive = choose_best(rows, model_name="tabular_cpu", settings=settings)
    assert naive.best == "tabular_cpu_config_2"  # ranking on the first pass picks the noise
    sel = choose_best(rows, model_name="tabular_cpu", passes=passes, settings=settings)
    assert sel.best == "tabular_cpu_config_3"
    assert "coefficient of variation 1.25 > 0.1" in sel.dropped["tabular_cpu_config_2"]
    assert "dropped tabular_cpu_config_2: unstable" in sel.report()
    assert [c for c, _ in sel.ranking] == ["tabular_cpu_config_3"]


def test_every_config_unstable_is_a_measurement_failure_not_a_verdict_on_the_model(settings):
    rows = read_results_csv(MA_RESULTS)
    configs = sorted({r.config for r in rows})
    with pytest.raises(MeasurementUnstableError, match="'tabular_cpu'.*measured stably") as err:
        choose_best(rows, model_name="tabular_cpu", unstable=configs, settings=settings)
    assert isinstance(err.value, ToolingError) and not isinstance(err.value, ProfilingError)
    # one config measured stably and too slow: that is a verdict (the model misses the constraint)
    with pytest.raises(ProfilingError, match="p99 latency"):
        choose_best(rows, model_name="tabular_cpu", unstable=configs[1:], p99_latency_ms=1.0, settings=settings)


def test_passes_alone_rank_only_stable_configs(settings):
    sel = choose_best([], model_name="tabular_cpu", passes=read_perf_passes(COLLAPSING_AND_STEADY_PASSES),
                      settings=settings)
    assert sel.best == "tabular_cpu_config_3" and set(sel.dropped) == {"tabular_cpu_config_2"}


def test_perf_analyzer_instability_flag_drops_the_config(settings):
    log = ("Profiling tabular_cpu_config_2: concurrency=4\n"
           "perf_analyzer: Failed to obtain stable measurement within 10 measurement windows\n"
           "Profiling tabular_cpu_config_3: concurrency=4\nok\n")
    flagged = unstable_configs_from_log(log, ["tabular_cpu_config_2", "tabular_cpu_config_3"])
    assert flagged == {"tabular_cpu_config_2"}
    sel = choose_best(read_results_csv(MA_RESULTS), model_name="tabular_cpu", unstable=flagged, settings=settings)
    assert sel.best == "tabular_cpu_config_3"
    assert sel.dropped["tabular_cpu_config_2"] == "perf_analyzer could not obtain a stable measurement"


def test_p99_constraint_drops_slow_configs_and_all_dropped_fails(settings):
    rows = read_results_csv(MA_RESULTS)
    sel = choose_best(rows, model_name="tabular_cpu", p99_latency_ms=100.0, settings=settings)
    assert "p99 latency 250.00 ms > constraint 100 ms" in sel.dropped["tabular_cpu_config_4"]
    with pytest.raises(ProfilingError, match="'tabular_cpu'.*p99 latency"):
        choose_best(rows, model_name="tabular_cpu", p99_latency_ms=1.0, settings=settings)


def test_results_csv_is_parsed_with_units(tmp_path):
    rows = read_results_csv(MA_RESULTS)
    assert rows[0] == ProfileRow("tabular_cpu_config_2", "tabular_cpu", 1, 4, 1312.4, 9.8, "2:CPU", 32, True)
    with pytest.raises(ProfilingError, match="do not exist"):
        read_results_csv(str(tmp_path / "missing.csv"))


def test_confirmation_repository_names_each_tried_config_after_its_folder(tmp_path):
    """Model Analyzer leaves every variant's config named after the base model; Triton refuses to
    load a folder whose config names another model, so the confirmation passes could never run."""
    out = tmp_path / "output_model_repository"
    for variant in ("tabular_cpu_config_default", "tabular_cpu_config_0"):
        (out / variant / "1").mkdir(parents=True)
        (out / variant / "1" / "model.onnx").write_bytes(b"onnx bytes")
        (out / variant / "config.pbtxt").write_text(CPU_ONLY_MODEL_CONFIG)  # name: "tabular_cpu"
    repo = confirmation_repository(out, ["tabular_cpu_config_0", "tabular_cpu_config_default"], tmp_path / "confirm")
    for variant in ("tabular_cpu_config_0", "tabular_cpu_config_default"):
        assert parse_config((repo / variant / "config.pbtxt").read_text()).name == variant
        assert (repo / variant / "1" / "model.onnx").read_bytes() == b"onnx bytes"
        assert parse_config((out / variant / "config.pbtxt").read_text()).name == "tabular_cpu"  # untouched
    with pytest.raises(ProfilingError, match="'tabular_cpu_config_9' is not in Model Analyzer's output"):
        confirmation_repository(out, ["tabular_cpu_config_9"], tmp_path / "confirm")


# ------------------------------------------------------------------------------ integration
TRITON_VENV = Path(__file__).resolve().parents[2] / ".venv-triton"


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.skipif(not (TRITON_VENV / "bin" / "model-analyzer").exists(), reason="Triton tools env missing")
def test_model_analyzer_profiles_a_cpu_model_and_the_chosen_config_fits_it(tmp_path):
    """Real Model Analyzer + local Triton + perf_analyzer, bounded to 1 searched config (+ default).

    perf_analyzer's stability criterion is relaxed to 50 % here because the shared test machine is
    heavily loaded; the stability gate itself is tested with the unstable passes above.
    """
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from ground.settings import Settings
    from model_registry.profiling.analyzer import profile_model
    from model_registry.triton_config import DynamicBatchingSpec, build_config, check_config, to_pbtxt
    from tritonflow.runtime.triton_tools import triton_tools

    s = Settings.from_env({}, home=tmp_path / "home", triton_venv=TRITON_VENV, analyzer_stability_cv=0.5)
    w = numpy_helper.from_array(np.random.default_rng(7).normal(size=(4, 2)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["features", "w"], ["scores"])], "g",
                          [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 4])],
                          [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 2])], initializer=[w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    repo = tmp_path / "repo"
    (repo / "tabular" / "1").mkdir(parents=True)
    onnx.save(model, str(repo / "tabular" / "1" / "model.onnx"))
    cfg = build_config("tabular", model, max_batch_size=8, dynamic_batching=DynamicBatchingSpec(max_queue_delay_us=100))
    (repo / "tabular" / "config.pbtxt").write_text(to_pbtxt(cfg))
    search = SearchSpace(max_batch_sizes=(8,), instance_counts=(1,), queue_delays_us=(100,), concurrency=(1,),
                         measurement_ms=1000, max_auto_adjusts=2)
    outcome = profile_model("tabular", cfg, model_repository=repo, work_dir=tmp_path / "work", search=search,
                            hardware=CPU_HOST, tools=triton_tools(s), settings=s, timeout_s=400)
    profile = yaml.safe_load(outcome.profile_config_path.read_text())
    assert profile["profile_models"]["tabular"]["cpu_only"] is True
    assert outcome.rows and all(r.throughput > 0 for r in outcome.rows)
    assert outcome.selection.best in {r.config for r in outcome.rows}
    assert outcome.config.name == "tabular"
    assert check_config(outcome.config, model) == []


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.skipif(not (TRITON_VENV / "bin" / "perf_analyzer").exists(), reason="Triton tools env missing")
def test_confirmation_passes_measure_each_tried_config_on_a_scratch_triton(tmp_path):
    """Real local Triton + perf_analyzer: two configs of Model Analyzer's output repository (named
    after the base model, as Model Analyzer leaves them) load side by side and are each measured in
    interleaved passes; a config that does not load is a tool failure, not a verdict."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from ground.exceptions import TransientError
    from ground.settings import Settings
    from model_registry.profiling.analyzer import measure_config_passes
    from model_registry.triton_config import build_config, to_pbtxt
    from tritonflow.runtime.triton_tools import triton_tools

    s = Settings.from_env({}, home=tmp_path / "home", triton_venv=TRITON_VENV, analyzer_stability_cv=0.5)
    w = numpy_helper.from_array(np.random.default_rng(3).normal(size=(4, 2)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["features", "w"], ["scores"])], "g",
                          [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 4])],
                          [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 2])], initializer=[w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    out = tmp_path / "run" / "output_model_repository"
    for c in ("tabular_config_0", "tabular_config_default"):
        (out / c / "1").mkdir(parents=True)
        onnx.save(model, str(out / c / "1" / "model.onnx"))
        (out / c / "config.pbtxt").write_text(to_pbtxt(build_config("tabular", model, max_batch_size=8)))
    (out / "tabular_config_broken" / "1").mkdir(parents=True)
    (out / "tabular_config_broken" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    (out / "tabular_config_broken" / "config.pbtxt").write_text(to_pbtxt(build_config("tabular", model,
                                                                                      max_batch_size=8)))

    configs = ["tabular_config_0", "tabular_config_default"]
    tools = triton_tools(s)
    measured = measure_config_passes(out, configs, 1, passes=1, tools=tools, settings=s, measurement_ms=500)
    assert set(measured) == set(configs)
    assert all(measured[c] and all(p.model == c for p in measured[c]) for c in configs)
    # perf_analyzer reached each config (a model it cannot reach fails the pass); on a loaded
    # machine a pass may be unstable (NaN figures), a stable one has real figures
    assert all(p.throughput > 0 and p.p99_ms > 0 for c in configs for p in measured[c] if p.stable)
    # the scratch Triton ran with the short exit timeout (its Python-backend models would take a
    # second each to unload at every stop otherwise)
    import re

    from model_registry.profiling.analyzer_config import SCRATCH_EXIT_TIMEOUT_S

    triton_log = (out.parent / "confirm_home" / "logs" / "triton.log").read_text()
    assert re.search(rf"\|\s*exit_timeout\s*\|\s*{SCRATCH_EXIT_TIMEOUT_S}\s*\|", triton_log), triton_log[-2000:]
    with pytest.raises(TransientError, match="tabular_config_broken"):
        measure_config_passes(out, ["tabular_config_broken"], 1, passes=1, tools=tools, settings=s,
                              measurement_ms=500)
