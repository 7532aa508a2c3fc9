"""Repository layout rules and path planning."""

from __future__ import annotations

import pytest

from ground.exceptions import RepositoryLayoutError
from repository_sync.layout import (
    VersionLayout,
    check_local_repository,
    find_layout_problems,
    join_key,
    plan_version,
    validate_model_name,
    validate_version,
)

CONFIG = 'name: "fraud_scorer"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 16\n'


def _make_tree(root, files):
    for rel in files:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(CONFIG if rel.endswith("config.pbtxt") else "")
    return root


def test_layout_a_model_file_directly_in_model_folder_is_rejected(tmp_path):
    # variant A of make_bad_layouts.sh (no numeric version directory)
    repo = _make_tree(tmp_path / "tmp_repo_A", ["fraud_scorer/config.pbtxt", "fraud_scorer/model.onnx"])
    with pytest.raises(RepositoryLayoutError) as err:
        check_local_repository(repo)
    message = str(err.value)
    assert "model 'fraud_scorer'" in message
    assert "'model.onnx' sits directly in the model folder 'fraud_scorer/'" in message
    assert "no numeric version folder" in message


def test_layout_b_non_numeric_version_folder_is_rejected(tmp_path):
    repo = _make_tree(tmp_path / "tmp_repo_B", ["fraud_scorer/config.pbtxt", "fraud_scorer/v7/model.onnx"])
    with pytest.raises(RepositoryLayoutError) as err:
        check_local_repository(repo)
    message = str(err.value)
    assert "model 'fraud_scorer'" in message
    assert "folder 'fraud_scorer/v7/' is not a version folder" in message
    assert "'fraud_scorer/7'" in message  # the suggested name


def test_expected_layout_with_signature_and_staging_folder_is_accepted(tmp_path):
    repo = _make_tree(
        tmp_path / "repo",
        [
            "fraud_scorer/config.pbtxt",
            "fraud_scorer/7/model.onnx",
            "fraud_scorer/7/model.onnx.sig",
            "fraud_scorer/7/config.pbtxt.intended",
            "fraud_scorer/.staging-8-abc/model.onnx",
            "fraud_scorer/labels.txt",
        ],
    )
    check_local_repository(repo)  # no error


@pytest.mark.parametrize("folder", ["7abc", "07", "0", "-3"])
def test_folders_triton_would_misread_are_flagged(folder):
    # Triton parses version folders with std::stoll: "7abc" reads as 7, "07" is ignored.
    problems = find_layout_problems([f"m/{folder}/model.onnx", "m/1/model.onnx"])
    assert [p.path for p in problems] == [f"m/{folder}/"]


def test_empty_version_folder_is_flagged():
    problems = find_layout_problems(["m/config.pbtxt", "m/3/"])
    assert any("version folder 'm/3/' is empty" in p.message for p in problems)


def test_plan_puts_model_signature_and_intended_config_in_numeric_folder():
    layout = plan_version("fraud_scorer", 7)
    assert str(layout.version_dir) == "fraud_scorer/7"
    assert str(layout.serving_config) == "fraud_scorer/config.pbtxt"
    assert layout.version_files == ("model.onnx", "config.pbtxt.intended", "model.onnx.sig")
    assert layout.key("/triton/", "7", "model.onnx") == "triton/fraud_scorer/7/model.onnx"


@pytest.mark.parametrize("name", ["fraud scorer", "../etc", ".hidden", "a/b", "", "x" * 129, "naïve", "-x"])
def test_unsafe_model_names_are_refused_with_the_rule(name):
    with pytest.raises(RepositoryLayoutError) as err:
        validate_model_name(name)
    assert repr(name) in str(err.value)


@pytest.mark.parametrize("name", ["fraud_scorer", "reco-ranker.v2", "A1"])
def test_safe_model_names_are_accepted(name):
    assert validate_model_name(name) == name


@pytest.mark.parametrize("version", [0, -1, "07", "v7", True, 1.5, None])
def test_versions_must_be_positive_integers(version):
    with pytest.raises(RepositoryLayoutError):
        validate_version(version)


def test_version_given_as_digit_string_is_accepted():
    assert VersionLayout("m", "12").version == 12


@pytest.mark.parametrize(
    "parts, expected",
    [(("/triton/", "m", "7", "model.onnx"), "triton/m/7/model.onnx"), (("", "m//7",), "m/7")],
)
def test_s3_keys_never_start_with_a_slash(parts, expected):
    assert join_key(*parts) == expected
