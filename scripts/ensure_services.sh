#!/usr/bin/env bash
# Make sure the machine's own services the real-deployment tests use are up: PostgreSQL (Airflow
# metadata DB, MLflow backend, drift history) and Redis (Celery broker). On this machine kind they
# are started before a session; this restarts them if they are down, with the same commands.
set -uo pipefail
if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  echo "[services] starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
  for _ in $(seq 1 30); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 1; done
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "[services] starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
fi
pg_isready -h 127.0.0.1 -p 5432 -q || { echo "[services] PostgreSQL is not available" >&2; exit 1; }
redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null || { echo "[services] Redis is not available" >&2; exit 1; }
