"""Connection arguments of the embedded deployment's SQLite metadata DB.

Airflow imports these dicts by path (``[database] sql_alchemy_connect_args`` and
``sql_alchemy_connect_args_async``, set by :class:`tritonflow.runtime.airflow.AirflowConfig` for a
SQLite database). Four Airflow processes and every task's API calls write to one file: with the
driver's default busy timeout of 5 s, a write that waits behind a long one fails with
``database is locked`` (seen as an HTTP 500 from the REST API on a loaded two-core machine).
Importing this module imports nothing.
"""

#: Seconds a write waits for SQLite's lock before failing (pysqlite's ``timeout``; default 5).
SQLITE_BUSY_TIMEOUT_S = 60.0

#: ``sql_alchemy_connect_args`` (sync engine, pysqlite).
SQLITE_CONNECT_ARGS = {"timeout": SQLITE_BUSY_TIMEOUT_S}

#: ``sql_alchemy_connect_args_async`` (async engine, aiosqlite takes the same ``timeout``).
SQLITE_CONNECT_ARGS_ASYNC = {"timeout": SQLITE_BUSY_TIMEOUT_S}
