"""Fixtures of the drift_checks tests: case inputs rebuilt in code, an S3 endpoint."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pandas as pd
import pytest

# All-null column and empty window inputs (reference.csv, current_promo_all_null.csv), rebuilt verbatim.
REFERENCE_SESSIONS_CSV = """session_minutes,device,promo_code,pages_viewed
10.11,ios,SPRING10,9
8.21,android,,16
18.66,ios,,16
26.85,android,,14
14.28,android,,24
10.73,ios,SPRING10,29
0.37,ios,VIP5,21
33.59,android,,22
41.7,desktop,SPRING10,1
17.31,android,SPRING10,18
5.09,desktop,SPRING10,8
36.5,ios,,14
2.47,desktop,,28
1.55,android,VIP5,29
8.5,desktop,,7
4.01,android,VIP5,28
10.67,ios,,16
16.34,android,SPRING10,14
5.49,desktop,SPRING10,25
1.09,desktop,VIP5,17
"""
PROMO_CODE_ALL_NULL_CSV = """session_minutes,device,promo_code,pages_viewed
37.49,ios,,3
1.06,ios,,24
19.86,android,,9
11.18,desktop,,2
10.44,ios,,14
12.21,desktop,,28
63.15,android,,18
32.93,desktop,,9
27.78,ios,,12
7.5,android,,30
5.74,desktop,,6
9.87,ios,,8
0.29,android,,6
1.76,desktop,,12
79.59,desktop,,18
2.41,android,,26
6.43,desktop,,30
28.69,android,,26
10.8,android,,28
39.21,ios,,25
"""
EMPTY_WINDOW_CSV = "session_minutes,device,promo_code,pages_viewed\n"


@pytest.fixture
def null_and_empty_windows():
    """(reference, all-null current, empty current) frames of this failure."""
    read = lambda s: pd.read_csv(io.StringIO(s))  # noqa: E731
    return read(REFERENCE_SESSIONS_CSV), read(PROMO_CODE_ALL_NULL_CSV), read(EMPTY_WINDOW_CSV)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _OwnMoto:
    def __init__(self):
        self.port = _free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        exe = Path(sys.executable).parent / "moto_server"
        self.proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("moto_server did not start")


@pytest.fixture(scope="session")
def drift_s3(request):
    """The lead's ``s3_server`` fixture when present, else a private moto server (same shape)."""
    try:
        yield request.getfixturevalue("s3_server")
        return
    except pytest.FixtureLookupError:
        pass
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        os.environ.setdefault(k, v)
    srv = _OwnMoto()
    yield srv
    srv.proc.terminate()
    srv.proc.wait(10)


@pytest.fixture
def s3_root(drift_s3):
    """A fresh bucket: (``s3://bucket/prefix``, endpoint_url)."""
    import boto3

    bucket = f"drift-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=drift_s3.endpoint_url).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/logs", drift_s3.endpoint_url
