"""The prepared training reference, cached on local disk by the digest of the sample's bytes.

Every hourly check of a model version used to prepare its reference again (each check runs in a
fresh task process): sort the finite values of every numeric column, compute the PSI bins, count
categories and look at the row order (:func:`drift_checks.verdict.prepare_reference`), about
0.1 s of CPU for 100,000 rows x 20 numeric features on the 2-core benchmark machine. This module
keeps that work in one ``.npz`` file per reference and loads it in about 10-20 ms instead.

**Key**: the SHA-256 of the ``sample.parquet`` bytes actually read by
:func:`drift_checks.reference.load_reference` (``Reference.sample_sha256``, computed on every load,
about 11 ms for 20 MB), the feature schema and :data:`FORMAT`. Re-recording a version's reference,
or any change of its file, changes the key, so a changed reference is never served from a stale
cache file. The file also stores its key and the column lists, checked on load; a file that does
not match, cannot be read, or lacks a column is ignored and rewritten.

**Values**: the cached arrays are the arrays :func:`prepare_reference` computes (written and
read back as raw float64, no conversion), so the statistics, thresholds and decisions are
bit-identical with and without the cache (tested).

**Calibrations** (:class:`CalibrationStore`): the reference-chunk calibration of a window size
(:func:`drift_checks.thresholds.calibrate_from_reference`: every statistic of up to 200 chunks of
the reference against the whole reference) is most of a small window's check: about 1.8 s for
66 chunks x 8 features (a 48-row hour), on every hourly check, each in a fresh task process. It
is stored beside the prepared reference, one JSON file per chunk size, quantile and statistics,
keyed also by the source of the modules that score the chunks and the numpy/scipy versions
(:func:`scoring_digest`), so changed scoring code never reads an old file. Floats are written
with ``repr`` (JSON), which reads back to the same float: the thresholds and decisions are the
same with and without the file (tested).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from drift_checks.binning import PsiBins
from drift_checks.inference_log import categorical_columns, numeric_columns

log = logging.getLogger(__name__)

#: Version of the cache file layout (part of the key: a new layout never reads an old file).
FORMAT = "prepared-reference-2"
#: Version of the calibration file layout (part of its key).
CALIBRATION_FORMAT = "reference-calibration-1"
#: Modules whose code scores the reference's chunks: their source is part of a calibration's key.
SCORING_MODULES = ("drift_checks.statistics", "drift_checks.numeric_statistics", "drift_checks.categorical_statistics",
                   "drift_checks.statistic_types", "drift_checks.binning", "drift_checks.thresholds",
                   "drift_checks.season_match")


def cache_key(sample_sha256: str, schema) -> str:
    """Hex key of one prepared reference: content digest, schema and :data:`FORMAT`.

    Args:
        sample_sha256: SHA-256 (hex) of the reference's ``sample.parquet`` bytes.
        schema: Its :class:`drift_checks.inference_log.LogSchema`.

    Raises:
        ValueError: ``sample_sha256`` is empty (an unkeyed reference is never cached).
    """
    if not sample_sha256:
        raise ValueError("sample_sha256 is empty; expected the SHA-256 of the reference sample's bytes")
    text = json.dumps({"format": FORMAT, "sample_sha256": sample_sha256, "schema": schema.to_dict()},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _path(cache_dir: Path, key: str) -> Path:
    return Path(cache_dir) / f"{key}.npz"


def _write(path: Path, key: str, prepared) -> None:
    """Store the prepared columns of ``prepared`` (atomically: a temporary file, then a rename)."""
    arrays: dict[str, np.ndarray] = {}
    numeric: dict[str, Any] = {}
    for i, (col, s) in enumerate(prepared.numeric.items()):
        arrays[f"v{i}"] = s.values
        entry = {"i": i, "n_rows": s.n_rows, "n_null": s.n_null, "n_pos_inf": s.n_pos_inf,
                 "n_neg_inf": s.n_neg_inf, "discrete": None}
        if s.values.size:  # PSI bins exist only for a column with finite values
            arrays[f"e{i}"] = s.psi_bins.edges
            entry["discrete"] = bool(s.psi_bins.discrete)
        numeric[col] = entry
    meta = {"key": key, "numeric": numeric, "categorical": prepared.categorical,
            "time_ordered": bool(prepared.time_ordered)}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)  # type: ignore[arg-type]  # numpy stubs: allow_pickle overlaps **kwds
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _read(path: Path, key: str, num_cols: list[str], cat_cols: list[str]) -> dict[str, Any] | None:
    """``{"numeric", "categorical", "time_ordered"}`` from a cache file; ``None`` when absent or unusable."""
    from drift_checks.numeric_statistics import NumericSample

    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(z["meta"].tobytes().decode())
            if meta.get("key") != key:
                return None
            if list(meta["numeric"]) != num_cols or list(meta["categorical"]) != cat_cols:
                return None
            numeric = {}
            for col, e in meta["numeric"].items():
                values = z[f"v{e['i']}"]
                if values.dtype != np.float64 or values.ndim != 1:
                    return None
                s = NumericSample(values=values, n_rows=int(e["n_rows"]), n_null=int(e["n_null"]),
                                  n_pos_inf=int(e["n_pos_inf"]), n_neg_inf=int(e["n_neg_inf"]))
                if e["discrete"] is not None:  # fills the cached property (what psi_edges returns)
                    s.__dict__["psi_bins"] = PsiBins(z[f"e{e['i']}"], bool(e["discrete"]))
                numeric[col] = s
        categorical = {c: {str(k): int(v) for k, v in counts.items()} for c, counts in meta["categorical"].items()}
        return {"numeric": numeric, "categorical": categorical, "time_ordered": bool(meta["time_ordered"])}
    except Exception as exc:  # noqa: BLE001 - a damaged cache file is rebuilt, never trusted
        log.warning("prepared-reference cache %s unreadable (%s: %s); preparing the reference again",
                    path, type(exc).__name__, exc)
        return None


@functools.lru_cache(maxsize=1)
def scoring_digest() -> str:
    """SHA-256 (hex) of the code that scores reference chunks: :data:`SCORING_MODULES`' source, numpy, scipy."""
    import importlib

    import scipy

    h = hashlib.sha256(f"numpy {np.__version__} scipy {scipy.__version__}".encode())
    for name in SCORING_MODULES:
        h.update(Path(str(importlib.import_module(name).__file__)).read_bytes())
    return h.hexdigest()


def _json_value(value: Any) -> Any:
    """Turn numpy scalars into Python numbers (``json.dumps`` default)."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


@dataclasses.dataclass(frozen=True)
class CalibrationStore:
    """The reference-chunk calibrations of one prepared reference, kept beside its cache file.

    What :attr:`drift_checks.verdict.PreparedReference.calibration_store` expects: ``load(key)``
    returns the stored :class:`~drift_checks.thresholds.Calibration` or ``None``; ``save(key,
    calibration)`` stores one. ``key`` is ``(chunk_rows, quantile, statistics names or None)``.
    A file that cannot be read or does not match its key is ignored (and rewritten); a file that
    cannot be written is logged: the check goes on with the calibration it computed.

    Attributes:
        folder: The cache folder.
        reference_key: :func:`cache_key` of the prepared reference.
    """

    folder: Path
    reference_key: str

    def _key_text(self, key: tuple) -> str:
        from drift_checks.thresholds import MAX_REFERENCE_CHUNKS

        size, quantile, names = key
        return json.dumps({"format": CALIBRATION_FORMAT, "reference": self.reference_key, "chunk_rows": int(size),
                           "quantile": float(quantile), "names": list(names) if names is not None else None,
                           "max_chunks": MAX_REFERENCE_CHUNKS, "code": scoring_digest()}, sort_keys=True)

    def path(self, key: tuple) -> Path:
        """The calibration file of ``key``."""
        digest = hashlib.sha256(self._key_text(key).encode()).hexdigest()[:32]
        return Path(self.folder) / f"{self.reference_key}.calibration-{digest}.json"

    def load(self, key: tuple):
        """The stored calibration of ``key``, or ``None``."""
        path = self.path(key)
        if not path.is_file():
            return None
        try:
            doc = json.loads(path.read_text())
            if doc.get("key") != self._key_text(key):
                return None
            return calibration_from_dict(doc["calibration"])
        except Exception as exc:  # noqa: BLE001 - a damaged file is recomputed, never trusted
            log.warning("reference calibration %s unreadable (%s: %s); scoring the chunks again", path,
                        type(exc).__name__, exc)
            return None

    def save(self, key: tuple, calibration) -> None:
        """Store ``calibration`` as ``key``'s file (atomically)."""
        path = self.path(key)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"key": self._key_text(key), "calibration": calibration_to_dict(calibration)},
                                      default=_json_value))
            os.replace(tmp, path)
        except (OSError, TypeError, ValueError) as exc:
            log.warning("reference calibration %s not written (%s); the check goes on without it", path, exc)
        finally:
            tmp.unlink(missing_ok=True)


def calibration_to_dict(calibration) -> dict[str, Any]:
    """JSON form of a :class:`~drift_checks.thresholds.Calibration` (:func:`calibration_from_dict` reads it)."""
    return {"chunk_rows": calibration.chunk_rows, "n_chunks": calibration.n_chunks, "quantile": calibration.quantile,
            "values": [[f, s, v] for (f, s), v in calibration.values.items()],
            "chunks": [{f: {n: {"name": r.name, "value": r.value, "status": r.status, "extra": dict(r.extra)}
                            for n, r in res.items()} for f, res in chunk.items()} for chunk in calibration.chunks]}


def calibration_from_dict(doc: Mapping[str, Any]):
    """The :class:`~drift_checks.thresholds.Calibration` of :func:`calibration_to_dict`'s form."""
    from drift_checks.statistic_types import StatisticResult
    from drift_checks.thresholds import Calibration

    chunks = tuple({f: {n: StatisticResult(r["name"], r["value"], r["status"], r["extra"]) for n, r in res.items()}
                    for f, res in chunk.items()} for chunk in doc["chunks"])
    return Calibration(int(doc["chunk_rows"]), int(doc["n_chunks"]), {(f, s): v for f, s, v in doc["values"]},
                       float(doc["quantile"]), chunks)


def prepared_training_reference(ref, cache_dir: Path | str | None, workers: int = 2):
    """The prepared reference of ``ref`` (a :class:`drift_checks.reference.Reference`), from the cache.

    Equal to ``prepare_reference(ref.frame, ref.schema, workers, reference_id=ref.reference_id,
    importance=ref.importance)``: on a miss it calls exactly that and stores the result; on a hit
    it loads the sorted columns, PSI bins, category counts and row-order flag stored by that call.

    Args:
        ref: The loaded reference (its ``sample_sha256`` keys the cache; ``""``: no cache).
        cache_dir: Folder of the cache files (``None``: no cache).
        workers: Threads sorting numeric columns on a miss.

    Returns:
        A :class:`drift_checks.verdict.PreparedReference`; with a cache folder its calibrations
        are kept there too (:class:`CalibrationStore`).

    Errors writing the cache (read-only or full disk) are logged and the prepared reference is
    returned all the same.
    """
    from drift_checks.verdict import PreparedReference, prepare_reference

    sha = getattr(ref, "sample_sha256", "")
    if cache_dir is None or not sha:
        return prepare_reference(ref.frame, ref.schema, workers, reference_id=ref.reference_id,
                                 importance=ref.importance)
    key = cache_key(sha, ref.schema)
    path = _path(Path(cache_dir), key)
    num_cols = [c for c in numeric_columns(ref.schema) if c in ref.frame.columns]  # as prepare_reference
    cat_cols = [c for c in categorical_columns(ref.schema) if c in ref.frame.columns]
    got = _read(path, key, num_cols, cat_cols)
    if got is not None:
        from drift_checks.declared_schema import typed_reference

        frame = typed_reference(ref.frame, ref.schema.features)  # the declared schema, as prepare_reference
        return PreparedReference(ref.schema, frame, got["numeric"], got["categorical"], ref.reference_id,
                                 dict(ref.importance) if ref.importance else None, got["time_ordered"],
                                 calibration_store=CalibrationStore(Path(cache_dir), key))
    prepared = prepare_reference(ref.frame, ref.schema, workers, reference_id=ref.reference_id,
                                 importance=ref.importance)
    prepared.calibration_store = CalibrationStore(Path(cache_dir), key)
    try:
        _write(path, key, prepared)
    except OSError as exc:
        log.warning("prepared-reference cache %s not written (%s); the check goes on without it", path, exc)
    return prepared
