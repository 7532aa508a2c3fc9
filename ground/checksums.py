"""The one SHA-256-of-a-file helper of tritonflow.

Repository pushes compare staged and published files with it, signature checks name a signature
file by it, and the pipelines record the digest of every window and log file they hand on. One
definition, so every recorded ``sha256`` means the same thing: lower-case hex of the file's bytes.
"""

from __future__ import annotations

import hashlib
import os
from typing import BinaryIO

#: Bytes read per block (1 MiB: constant memory on multi-GB model files).
CHUNK_BYTES = 1 << 20


def sha256_file(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file's bytes.

    Args:
        path: The file.

    Returns:
        64 lower-case hex digits.

    Raises:
        OSError: The file cannot be read (e.g. ``FileNotFoundError``).
    """
    with open(path, "rb") as fh:
        return sha256_stream(fh)


def sha256_stream(stream: BinaryIO) -> str:
    """SHA-256 of what is left to read in a binary stream (a file, an S3 object body).

    Args:
        stream: Anything with ``read(n) -> bytes``; read to its end in ``CHUNK_BYTES`` blocks.

    Returns:
        64 lower-case hex digits.

    Raises:
        OSError: The stream cannot be read.
    """
    digest = hashlib.sha256()
    while block := stream.read(CHUNK_BYTES):
        digest.update(block)
    return digest.hexdigest()
