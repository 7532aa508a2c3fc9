"""Read and write Triton's model configuration (``config.pbtxt``): the one parser and serialiser.

The message type is :class:`tritonclient.grpc.model_config_pb2.ModelConfig` (Triton's own
``model_config.proto``). A config travels in two encodings:

* protobuf **text format** (``config.pbtxt`` and the signed ``config.pbtxt.intended`` of each
  version), read and written with :mod:`google.protobuf.text_format`;
* **JSON**, the encoding Triton's load API takes in its ``config`` parameter and returns from
  ``GET /v2/models/<name>/config``, read and written with :mod:`google.protobuf.json_format`.

:func:`parse_config` accepts either encoding (text or bytes), a JSON-like ``dict`` or a message, and
optionally pins the config to a model name, because Triton refuses a config whose ``name`` is not
its folder's. :func:`to_pbtxt` and :func:`to_json` write the two encodings. Building a config from a
model's inputs and outputs, and checking it against the model, stay in
:mod:`model_registry.triton_config`, which reads and writes through this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ground.exceptions import DataError, ModelConfigError
from repository_sync.layout import default_model_filename

if TYPE_CHECKING:  # pragma: no cover
    from tritonclient.grpc import model_config_pb2


def parse_config(
    config: Any,
    source: str | None = None,
    *,
    model_name: str | None = None,
    error: type[DataError] = ModelConfigError,
) -> "model_config_pb2.ModelConfig":
    """Parse a Triton model configuration into a new ``ModelConfig`` message.

    Args:
        config: ``config.pbtxt`` text (comments allowed) or JSON text, as ``str`` or UTF-8
            ``bytes``; a JSON-like ``dict`` (Triton's ``/config`` answer); or a ``ModelConfig``
            message, which is copied. JSON fields this client's ``model_config.proto`` does not
            know (a newer Triton) are ignored.
        source: Name of the config in error messages (a path, say); default ``config.pbtxt``, or
            ``config.pbtxt for model '<model_name>'`` when ``model_name`` is given.
        model_name: The Triton model the config must name: an empty ``name`` is filled in with
            it, a different one is refused. ``None`` leaves the name as parsed.
        error: The :class:`~ground.exceptions.DataError` subclass raised; the load path passes
            :class:`~ground.exceptions.ModelLoadRefusedError` (a config Triton would refuse).

    Returns:
        A ``ModelConfig`` that shares nothing with ``config``.

    Raises:
        ModelConfigError: (or ``error``) The text is not a valid ``ModelConfig`` (the message
            carries protobuf's line and column), or its ``name`` differs from ``model_name``.
    """
    where = source or (f"config.pbtxt for model {model_name!r}" if model_name else "config.pbtxt")
    msg = _decode(config, where, error)
    if model_name is not None:
        if msg.name and msg.name != model_name:
            raise error(
                f"{where}: name {msg.name!r} differs from the model name {model_name!r}; "
                "Triton refuses a config whose name is not its folder's"
            )
        msg.name = model_name
    return msg


def _decode(config: Any, where: str, error: type[DataError]) -> "model_config_pb2.ModelConfig":
    """``config`` in whichever encoding it came, as a new message (see :func:`parse_config`)."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    msg = model_config_pb2.ModelConfig()
    try:
        if isinstance(config, model_config_pb2.ModelConfig):
            msg.CopyFrom(config)
        elif isinstance(config, Mapping):
            json_format.ParseDict(dict(config), msg, ignore_unknown_fields=True)
        else:
            text = config.decode() if isinstance(config, (bytes, bytearray)) else str(config)
            if text.lstrip().startswith("{"):
                json_format.Parse(text, msg, ignore_unknown_fields=True)
            else:
                text_format.Parse(text, msg)
    except (text_format.ParseError, json_format.ParseError, UnicodeDecodeError) as exc:
        raise error(f"{where}: not a valid Triton model configuration: {exc}") from exc
    return msg


def to_pbtxt(config: "model_config_pb2.ModelConfig") -> str:
    """Render a ``ModelConfig`` as ``config.pbtxt`` text.

    Args:
        config: The message.

    Returns:
        Protobuf text format (``text_format.MessageToString``), one field per line; reading it
        back with :func:`parse_config` gives an equal message.
    """
    from google.protobuf import text_format

    return text_format.MessageToString(config)


def to_json(config: "model_config_pb2.ModelConfig") -> str:
    """Render a ``ModelConfig`` as the one-line JSON Triton's load API takes in ``config``.

    Args:
        config: The message.

    Returns:
        JSON with the proto's field names (``max_batch_size``, not ``maxBatchSize``), no
        indentation.
    """
    from google.protobuf import json_format

    return json_format.MessageToJson(config, preserving_proto_field_name=True, indent=None)


def model_filename_for(config: "model_config_pb2.ModelConfig") -> str:
    """The file name Triton opens inside a version folder for this config.

    Args:
        config: The version's ``ModelConfig``.

    Returns:
        ``default_model_filename`` when set, else the default of its platform or backend
        (``model.onnx`` for ``onnxruntime``).

    Raises:
        RepositoryLayoutError: Neither ``default_model_filename``, a known platform nor a known
            backend is set.
    """
    if config.default_model_filename:
        return config.default_model_filename
    return default_model_filename(config.platform or config.backend)
