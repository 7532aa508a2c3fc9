"""Building Triton input tensors from a sample, with integer ids kept exact.

Integer inputs are built from object/int columns value by value, never through float, so
``9007199254740993`` (2**53 + 1) arrives exactly (:func:`exact_integer`). A row with a missing or
non-integer id is not sent; :func:`frame_to_inputs` reports it with its reason so the caller can
count it as an invalid request. Used by :class:`repository_sync.triton.client.TritonModelControl`
and the pipelines that replay logged inputs.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from ground.exceptions import DataError

#: Floats at or above this magnitude may be rounded integers (IEEE 754 binary64, 53-bit significand;
#: the largest "safe" integer is 2**53 - 1).
FLOAT64_EXACT_INT_LIMIT = 2**53
_INT_TEXT_RE = re.compile(r"^[+-]?\d+$")
_INT_DATATYPES = {"INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"}


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One model input as Triton serves it.

    Attributes:
        name: Tensor name.
        datatype: Triton datatype string (``INT64``, ``FP32``...).
        dims: Per-row dims (without the batch axis when the model batches).
    """

    name: str
    datatype: str
    dims: tuple[int, ...]


# --------------------------------------------------------------------------- input building
def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    try:
        import pandas as pd

        if value is pd.NA or value is pd.NaT:
            return True
    except ImportError:  # pragma: no cover
        pass
    return isinstance(value, float) and math.isnan(value) or (
        isinstance(value, np.floating) and bool(np.isnan(value))
    )


def exact_integer(value: Any, datatype: str = "INT64") -> int:
    """Convert one id value to a Python int without a float round trip.

    Args:
        value: int, numpy integer, decimal string, or an integral float below 2**53.
        datatype: Target Triton integer type (range-checked).

    Returns:
        The exact integer.

    Raises:
        ValueError: Missing, not an integer, a float at or above 2**53 (its digits may already be lost,
            read the column as strings or pandas ``Int64``), or out of the datatype's range. The
            message says which.
    """
    if _is_missing(value):
        raise ValueError("missing value")
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"boolean {value!r} is not an integer id")
    if isinstance(value, numbers.Integral):
        out = int(value)
    elif isinstance(value, str):
        text = value.strip()
        if not _INT_TEXT_RE.match(text):
            raise ValueError(f"{value!r} is not an integer")
        out = int(text)
    elif isinstance(value, numbers.Real):
        f = float(value)
        if not f.is_integer():
            raise ValueError(f"{value!r} is not an integer")
        if abs(f) >= FLOAT64_EXACT_INT_LIMIT:  # 2**53 + 1 rounds to 2**53: ambiguous from here on
            raise ValueError(
                f"{value!r} arrived as a float at or above 2**53 and may have lost digits; read ids as "
                "strings or pandas 'Int64', never float"
            )
        out = int(f)
    else:
        raise ValueError(f"{value!r} ({type(value).__name__}) is not an integer")
    info = np.iinfo(datatype.lower())
    if not info.min <= out <= info.max:
        raise ValueError(f"{out} is outside the {datatype} range [{info.min}, {info.max}]")
    return out


def frame_to_inputs(
    frame, specs: Sequence[InputSpec]
) -> tuple[dict[str, np.ndarray], list[int], list[tuple[int, str]]]:
    """Build request tensors from a pandas DataFrame, refusing bad rows instead of coercing them.

    Each input is taken from the column of the same name (per-row dims ``[1]`` or ``[]``). With a
    single input of dims ``[k]`` whose name is not a column, the frame's ``k`` columns are stacked.

    Args:
        frame: ``pandas.DataFrame`` of requests, one row per request.
        specs: The model's inputs.

    Returns:
        ``(arrays, rows_sent, invalid_rows)``: arrays of shape ``(len(rows_sent), *dims)``;
        ``invalid_rows`` lists ``(position, reason)`` for rows with a missing/invalid value.

    Raises:
        DataError: A needed column is absent (the message lists the columns).
    """
    invalid: dict[int, str] = {}
    columns: dict[str, list] = {}
    for spec in specs:
        cols = _input_columns(frame, spec, len(specs))
        for col in cols:
            for pos, value in enumerate(frame[col].astype(object)):
                if pos in invalid:
                    continue
                problem = _value_problem(value, spec.datatype)
                if problem is not None:
                    invalid[pos] = f"{col}: {problem}"
        columns[spec.name] = cols
    rows = [i for i in range(len(frame)) if i not in invalid]
    arrays = {spec.name: _input_array(frame, spec, columns[spec.name], rows) for spec in specs}
    return arrays, rows, sorted(invalid.items())


def _input_columns(frame, spec: InputSpec, n_specs: int) -> list:
    """The frame columns ``spec`` is read from: its own column, or all of them for a lone ``[k]`` input.

    Raises:
        DataError: Neither applies (the message lists the columns).
    """
    if spec.name in frame.columns:
        return [spec.name]
    if n_specs == 1 and len(spec.dims) == 1 and spec.dims[0] in (-1, frame.shape[1]):
        return list(frame.columns)
    raise DataError(
        f"input {spec.name!r} ({spec.datatype}, dims {list(spec.dims)}) has no column in the "
        f"sample; columns are {list(frame.columns)}"
    )


def _value_problem(value: Any, datatype: str) -> str | None:
    """Why one cell cannot be sent as ``datatype`` (missing, or not an exact integer id), else ``None``."""
    if datatype in _INT_DATATYPES:
        try:
            exact_integer(value, datatype)
        except ValueError as exc:
            return str(exc)
        return None
    return "missing value" if _is_missing(value) else None


def _input_array(frame, spec: InputSpec, cols: list, rows: list[int]) -> np.ndarray:
    """The tensor for ``spec`` from ``cols`` of the valid ``rows``, shaped ``(len(rows), *dims)``."""
    from tritonclient.utils import triton_to_np_dtype

    arr: np.ndarray
    if spec.datatype in _INT_DATATYPES:
        data = [[exact_integer(frame[c].iloc[i], spec.datatype) for c in cols] for i in rows]
        arr = np.array(data, dtype=triton_to_np_dtype(spec.datatype)).reshape(len(rows), len(cols))
    elif spec.datatype == "BYTES":
        arr = np.array([[str(frame[c].iloc[i]).encode() for c in cols] for i in rows], dtype=object)
        arr = arr.reshape(len(rows), len(cols))
    else:
        arr = frame[cols].iloc[rows].to_numpy(dtype=triton_to_np_dtype(spec.datatype))
        arr = arr.reshape(len(rows), len(cols))
    if spec.dims == ():
        arr = arr.reshape(len(rows))
    return arr


def check_input_array(spec: InputSpec, array: np.ndarray) -> np.ndarray:
    """``array`` in the numpy dtype of ``spec``'s Triton datatype, refusing lossy float ids.

    Args:
        spec: The model input it is sent as (name, Triton datatype).
        array: The values, any shape.

    Returns:
        The array, converted to the input's dtype when it was another (``object`` for ``BYTES``).

    Raises:
        DataError: The input is an integer datatype but ``array`` holds floats (ids above 2**53
            would lose digits).
    """
    from tritonclient.utils import triton_to_np_dtype

    target = np.dtype(triton_to_np_dtype(spec.datatype)) if spec.datatype != "BYTES" else np.dtype(object)
    array = np.asarray(array)
    if spec.datatype in _INT_DATATYPES and array.dtype.kind == "f":
        raise DataError(
            f"input {spec.name!r} is {spec.datatype} but the sample array is {array.dtype}: ids above "
            "2**53 lose digits through float; pass an integer array or a DataFrame with object/int columns"
        )
    if array.dtype != target:
        array = array.astype(target)
    return array
