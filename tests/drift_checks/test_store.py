"""The drift object store: one interface over a folder and an S3 prefix, same behaviour on both."""

from __future__ import annotations

import pytest

from drift_checks.storage import FolderStore, S3Store, Store
from ground.exceptions import WindowError


@pytest.fixture(params=["folder", pytest.param("s3", marks=pytest.mark.integration)])
def store(request, tmp_path):
    if request.param == "folder":
        return Store(str(tmp_path / "logs"))
    root, endpoint_url = request.getfixturevalue("s3_root")
    return Store(root, endpoint_url=endpoint_url)


def test_store_picks_the_backend_of_its_root(tmp_path):
    assert type(Store(str(tmp_path))) is FolderStore and not Store(str(tmp_path)).is_s3
    s3 = Store("s3://bucket/a/prefix/", endpoint_url="http://127.0.0.1:9")
    assert type(s3) is S3Store and s3.is_s3
    assert (s3.bucket, s3.prefix, s3.uri("m/x.parquet")) == ("bucket", "a/prefix", "s3://bucket/a/prefix/m/x.parquet")


@pytest.mark.parametrize("root", ["", "s3://", "s3://host:9000/bucket"])
def test_a_root_without_a_folder_or_bucket_is_refused_with_the_expected_form(root):
    with pytest.raises(WindowError, match="expected"):
        Store(root)


def test_both_backends_write_read_and_list_the_same_way(store):
    uri = store.put_bytes("m/date=2024-05-01/a.parquet", b"first")
    store.put_bytes("m/date=2024-05-01/a.parquet", b"second")  # replaced whole, never appended
    store.put_bytes("m/date=2024-05-02/b.parquet", b"x")
    store.put_bytes("other/c.parquet", b"y")
    assert uri == store.uri("m/date=2024-05-01/a.parquet")
    assert store.get_bytes("m/date=2024-05-01/a.parquet") == b"second"
    assert store.exists("m/date=2024-05-02/b.parquet") and not store.exists("m/date=2024-05-02")
    assert store.list("m") == ["m/date=2024-05-01/a.parquet", "m/date=2024-05-02/b.parquet"]
    assert store.list("absent") == []
    with pytest.raises(FileNotFoundError):
        store.get_bytes("m/missing.parquet")


def test_temporary_files_of_an_interrupted_write_are_not_listed(tmp_path):
    store = Store(str(tmp_path))
    store.put_bytes("m/a.parquet", b"a")
    (tmp_path / "m" / ".a.parquet.123.tmp").write_bytes(b"partial")
    assert store.list("m") == ["m/a.parquet"]


def test_a_new_store_backend_registers_by_scheme_and_an_unknown_scheme_is_refused(tmp_path):
    class ScratchStore(FolderStore, scheme="scratchtest"):
        def __init__(self, root, endpoint_url=None):
            super().__init__(tmp_path / str(root).split("://", 1)[1], endpoint_url)

    try:
        store = Store("scratchtest://logs")
        assert isinstance(store, ScratchStore)
        store.put_bytes("a/b.bin", b"x")
        assert store.get_bytes("a/b.bin") == b"x" and (tmp_path / "logs" / "a" / "b.bin").read_bytes() == b"x"
    finally:
        del Store.BACKENDS["scratchtest"]
    with pytest.raises(WindowError, match=r"scheme 'scratchtest'; expected a folder or one of \['s3://'\]"):
        Store("scratchtest://logs")
