#!/usr/bin/env bash
# Make sure the machine's own services the real-deployment tests use are up: PostgreSQL (Airflow
# metadata DB, MLflow backend, drift history) and Redis (Celery broker). On this machine kind they
# are started before a session; this restarts them if they are down, with the same commands.
set -uo pipefail
pg_version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -1)
if [ -n "$pg_version" ] && ! grep -Eq "^host +all +all +127.0.0.1/32 +trust" "/etc/postgresql/$pg_version/main/pg_hba.conf"; then
  # A cluster freshly installed by setup.sh asks for peer/password auth; the tests and the local
  # deployment connect as postgres@127.0.0.1 without a password (loopback only, as on CI machines).
  echo "[services] PostgreSQL: trust auth for the loopback interface"
  hba="/etc/postgresql/$pg_version/main/pg_hba.conf"
  { echo "# tritonflow-local-trust"; echo "local all all trust"; echo "host all all 127.0.0.1/32 trust";
    echo "host all all ::1/128 trust"; cat "$hba"; } > "$hba.new" && mv "$hba.new" "$hba"
  chown postgres:postgres "$hba" 2>/dev/null || true
  pg_ctlcluster --skip-systemctl-redirect "$pg_version" main reload 2>/dev/null || true
fi
if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  echo "[services] starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$pg_version" main start || true
  for _ in $(seq 1 30); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 1; done
fi
# The tests' scratch database
if pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null && \
   [ "$(psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='test'" 2>/dev/null)" != "1" ]; then
  psql -h 127.0.0.1 -U postgres -qc "CREATE DATABASE test" || true
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "[services] starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
fi
pg_isready -h 127.0.0.1 -p 5432 -q || { echo "[services] PostgreSQL is not available" >&2; exit 1; }
redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null || { echo "[services] Redis is not available" >&2; exit 1; }
