"""The one file checksum: SHA-256 of the bytes, whatever the file size."""

from __future__ import annotations

import hashlib

import pytest

from ground.checksums import CHUNK_BYTES, sha256_file, sha256_stream


@pytest.mark.parametrize("size", [0, 1, CHUNK_BYTES, 2 * CHUNK_BYTES + 17])
def test_file_digest_is_the_sha256_of_its_bytes_across_block_boundaries(tmp_path, size):
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()
    assert sha256_file(str(path)) == sha256_file(path)


def test_a_missing_file_raises_instead_of_hashing_nothing(tmp_path):
    with pytest.raises(FileNotFoundError):
        sha256_file(tmp_path / "absent.bin")


@pytest.mark.parametrize("size", [0, CHUNK_BYTES + 3])
def test_stream_digest_matches_the_file_digest(tmp_path, size):
    path = tmp_path / "blob.bin"
    path.write_bytes(b"x" * size)
    with open(path, "rb") as fh:
        assert sha256_stream(fh) == sha256_file(path)


def test_storage_and_signing_use_the_same_helper():
    from repository_sync import signing
    from repository_sync.storage import base, filesystem, s3

    assert base.sha256_file is sha256_file
    assert filesystem.sha256_file is sha256_file
    assert s3.sha256_stream is sha256_stream
    assert signing.sha256_file is sha256_file
