"""Signing and verification of version folders with OpenSSF model-signing."""

from __future__ import annotations

import hashlib
import shutil

import pytest

from ground.exceptions import DataError, SignatureVerificationError
from repository_sync.signing import (
    SigningKeyError,
    generate_key_pair,
    key_id_of,
    sign_version,
    verify_version,
)

SIG = "model.onnx.sig"


@pytest.fixture
def version_dir(tmp_path):
    folder = tmp_path / "7"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"\x08\x07onnx-bytes" * 100)
    (folder / "config.pbtxt.intended").write_text('name: "m"\nbackend: "onnxruntime"\n')
    return folder


def test_signature_covers_model_and_config_and_reports_digest_and_key_id(version_dir, signing_keys):
    info = sign_version(version_dir, signing_keys.private, signature_file=SIG)
    assert info.files == ("config.pbtxt.intended", "model.onnx")
    assert info.key_id == signing_keys.key_id == key_id_of(signing_keys.public.read_bytes())
    assert info.signature_digest == hashlib.sha256((version_dir / SIG).read_bytes()).hexdigest()
    verified = verify_version(version_dir, signing_keys.trusted_dir, signature_file=SIG)
    assert verified.key_id == info.key_id and verified.signature_digest == info.signature_digest


def test_tampered_model_file_is_refused_naming_the_file(version_dir, signing_keys):
    sign_version(version_dir, signing_keys.private, signature_file=SIG)
    data = bytearray((version_dir / "model.onnx").read_bytes())
    data[10] ^= 1
    (version_dir / "model.onnx").write_bytes(bytes(data))
    with pytest.raises(SignatureVerificationError, match=r"modified file\(s\): model.onnx"):
        verify_version(version_dir, signing_keys.trusted_dir, signature_file=SIG)


def test_changed_serving_config_is_refused(version_dir, signing_keys):
    sign_version(version_dir, signing_keys.private, signature_file=SIG)
    (version_dir / "config.pbtxt.intended").write_text('name: "m"\nbackend: "python"\n')
    with pytest.raises(SignatureVerificationError, match="config.pbtxt.intended"):
        verify_version(version_dir, signing_keys.trusted_dir, signature_file=SIG)


def test_extra_and_missing_files_are_refused_and_named(version_dir, signing_keys):
    sign_version(version_dir, signing_keys.private, signature_file=SIG)
    (version_dir / "model.py").write_text("import os")
    (version_dir / "config.pbtxt.intended").unlink()
    with pytest.raises(SignatureVerificationError) as err:
        verify_version(version_dir, signing_keys.trusted_dir, signature_file=SIG)
    assert "unsigned extra file(s): model.py" in str(err.value)
    assert "signed file(s) missing: config.pbtxt.intended" in str(err.value)


def test_missing_signature_is_refused_naming_the_signature_file(version_dir, signing_keys):
    with pytest.raises(SignatureVerificationError, match=r"model.onnx.sig' is missing"):
        verify_version(version_dir, signing_keys.trusted_dir, signature_file=SIG)


def test_signature_from_an_untrusted_key_is_refused(version_dir, signing_keys, other_keys):
    sign_version(version_dir, other_keys.private, signature_file=SIG)
    with pytest.raises(SignatureVerificationError, match=other_keys.key_id):
        verify_version(version_dir, signing_keys.trusted_dir, signature_file=SIG)


def test_key_rotation_trusts_old_and_new_keys_together(tmp_path, version_dir, signing_keys, other_keys):
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    shutil.copy(signing_keys.public, trusted / "old.pub")
    shutil.copy(other_keys.public, trusted / "new.pub")
    for keys in (signing_keys, other_keys):
        sign_version(version_dir, keys.private, signature_file=SIG)
        assert verify_version(version_dir, trusted, signature_file=SIG).key_id == keys.key_id


def test_corrupted_signature_bundle_is_refused(version_dir, signing_keys):
    sign_version(version_dir, signing_keys.private, signature_file=SIG)
    text = (version_dir / SIG).read_text()
    (version_dir / SIG).write_text(text.replace('"sig":"', '"sig":"AAAA', 1))
    with pytest.raises(SignatureVerificationError, match="does not verify"):
        verify_version(version_dir, signing_keys.trusted_dir, signature_file=SIG)


def test_private_key_given_as_pem_bytes_signs_like_the_file(version_dir, signing_keys):
    info = sign_version(version_dir, signing_keys.private.read_bytes(), signature_file=SIG)
    assert info.key_id == signing_keys.key_id
    verify_version(version_dir, signing_keys.public, signature_file=SIG)


def test_missing_private_key_file_is_a_clear_error(version_dir, tmp_path):
    with pytest.raises(SigningKeyError, match="does not exist"):
        sign_version(version_dir, tmp_path / "nope.pem", signature_file=SIG)


def test_generated_private_key_is_private_and_not_overwritten(tmp_path):
    generate_key_pair(tmp_path / "k.pem", tmp_path / "k.pub")
    assert (tmp_path / "k.pem").stat().st_mode & 0o077 == 0
    with pytest.raises(SigningKeyError, match="exists"):
        generate_key_pair(tmp_path / "k.pem", tmp_path / "k.pub")


def test_a_generated_private_key_appears_only_once_its_public_key_is_written(tmp_path, monkeypatch):
    """A concurrent publish that finds the private key must find the trusted public key too."""
    import os

    from repository_sync import signing

    private, public = tmp_path / "keys" / "k.pem", tmp_path / "keys" / "trusted" / "k.pub"
    seen = []
    real_replace = os.replace

    def replace(src, dst):
        seen.append((private.exists(), public.is_file()))
        real_replace(src, dst)

    monkeypatch.setattr(signing.os, "replace", replace)
    generate_key_pair(private, public)
    assert seen == [(False, True)]
    assert private.is_file() and oct(private.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in private.parent.iterdir() if p.is_file()] == ["k.pem"]  # no staged file left


def test_empty_trusted_keys_folder_is_refused(version_dir, signing_keys, tmp_path):
    sign_version(version_dir, signing_keys.private, signature_file=SIG)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SigningKeyError, match="no trusted public key"):
        verify_version(version_dir, tmp_path / "empty", signature_file=SIG)


def _sign_bypassing_checks(folder, private_key):
    """Sign with model_signing itself (what an older tritonflow did): no completeness check."""
    from model_signing import signing

    from repository_sync.signing import _hashing_config

    config = signing.Config().set_hashing_config(_hashing_config(SIG))
    config.use_elliptic_key_signer(private_key=private_key)
    config.sign(folder, folder / SIG)


@pytest.mark.parametrize("files", [{}, {"README.txt": b"placeholder, model upload failed\n"}],
                         ids=["empty", "stray_file_only"])
def test_version_folder_without_model_and_config_is_not_signed(tmp_path, signing_keys, files):
    folder = tmp_path / "fraud_model" / "7"
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    with pytest.raises(DataError) as err:
        sign_version(folder, signing_keys.private, signature_file=SIG)
    message = str(err.value)
    assert str(folder) in message and "config.pbtxt.intended" in message and "model.onnx" in message
    assert not (folder / SIG).exists()


def test_folder_with_config_but_no_model_file_is_not_signed(version_dir, signing_keys):
    (version_dir / "model.onnx").unlink()
    with pytest.raises(DataError, match=r"missing model\.onnx"):
        sign_version(version_dir, signing_keys.private, signature_file=SIG)


def test_model_file_named_by_the_intended_config_must_be_present(version_dir, signing_keys):
    (version_dir / "config.pbtxt.intended").write_text(
        'name: "m"\nbackend: "onnxruntime"\ndefault_model_filename: "other.onnx"\n')
    with pytest.raises(DataError, match=r"missing other\.onnx"):
        sign_version(version_dir, signing_keys.private, signature_file=SIG)


@pytest.mark.parametrize("files", [{}, {"README.txt": b"placeholder\n"},
                                   {"model.onnx": b"\x08\x07onnx-bytes"}],
                         ids=["empty", "stray_file_only", "model_without_config"])
def test_verification_refuses_a_manifest_without_model_and_config(tmp_path, signing_keys, files):
    folder = tmp_path / "fraud_model" / "8"
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    _sign_bypassing_checks(folder, signing_keys.private)
    with pytest.raises(SignatureVerificationError, match="does not cover") as err:
        verify_version(folder, signing_keys.trusted_dir, signature_file=SIG)
    assert "config.pbtxt.intended" in str(err.value)


def test_verification_refuses_a_manifest_without_the_model_the_config_names(version_dir, signing_keys):
    (version_dir / "config.pbtxt.intended").write_text(
        'name: "m"\nbackend: "onnxruntime"\ndefault_model_filename: "other.onnx"\n')
    _sign_bypassing_checks(version_dir, signing_keys.private)
    with pytest.raises(SignatureVerificationError, match=r"does not cover other\.onnx"):
        verify_version(version_dir, signing_keys.trusted_dir, signature_file=SIG)
