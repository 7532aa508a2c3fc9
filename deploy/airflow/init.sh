#!/usr/bin/env bash
# One-shot initialisation of the tritonflow stack, run by the `airflow-init` service as root
# (docker-compose.yaml mounts this file; it needs no exec bit: the service runs `bash init.sh`).
# Safe to re-run: every step is idempotent.
#
#  1. ownership of the shared volumes (logs, signing keys, gateway snippets) -> AIRFLOW_UID:0
#  2. airflow db migrate
#  3. Airflow connections from the _TRITONFLOW_CONN_<CONN_ID> variables (JSON, re-created each run
#     so a changed .env value takes effect)
#  4. the SimpleAuthManager passwords file of the admin user
#  5. an ECDSA P-256 signing key pair at TRITONFLOW_SIGNING_KEY_PATH (the signing-keys volume every
#     Airflow container mounts), unless one exists
set -euo pipefail

uid="${AIRFLOW_UID:-50000}"
home="${TRITONFLOW_HOME:?TRITONFLOW_HOME must be set}"
gateway="${TRITONFLOW_GATEWAY_CONF_DIR:?TRITONFLOW_GATEWAY_CONF_DIR must be set}"
airflow_bin="$(command -v airflow)"
key="${TRITONFLOW_SIGNING_KEY_PATH:-$home/keys/model_signing.pem}"
trusted="${TRITONFLOW_SIGNING_TRUSTED_KEYS_DIR:-$home/keys/trusted}"

echo "[init] airflow $("$airflow_bin" version)"

echo "[init] shared volumes -> ${uid}:0"
shared=(/opt/airflow/logs "$home" "$gateway" "$(dirname "$key")" "$trusted")
if [ -n "${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE:-}" ]; then
  shared+=("$(dirname "$AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE")")
fi
mkdir -p "${shared[@]}" "$gateway/http.d" "$gateway/locations.d"
chown -R "${uid}:0" "${shared[@]}"

echo "[init] airflow db migrate"
"$airflow_bin" db migrate

echo "[init] connections"
while IFS='=' read -r var _; do
  conn_id="$(printf '%s' "${var#_TRITONFLOW_CONN_}" | tr '[:upper:]' '[:lower:]')"
  "$airflow_bin" connections delete "$conn_id" >/dev/null 2>&1 || true
  "$airflow_bin" connections add "$conn_id" --conn-json "${!var}" >/dev/null
  echo "[init]   $conn_id"
done < <(env | grep -E '^_TRITONFLOW_CONN_[A-Z0-9_]+=' | sort)

if [ -n "${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE:-}" ]; then
  echo "[init] admin user ${_AIRFLOW_ADMIN_USERNAME:-admin}"
  python - <<'PY'
import json, os
path = os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]
user = os.environ.get("_AIRFLOW_ADMIN_USERNAME") or "admin"
password = os.environ.get("_AIRFLOW_ADMIN_PASSWORD") or "admin"
with open(path, "w") as fh:
    fh.write(json.dumps({user: password}) + "\n")
os.chmod(path, 0o600)
PY
  chown "${uid}:0" "$AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"
fi

if [ ! -f "$key" ]; then
  echo "[init] generating the model signing key pair ($key)"
  KEY="$key" PUB="$trusted/$(basename "${key%.*}").pub" python - <<'PY'
import os
from repository_sync.signing import generate_key_pair
print("[init]   key id", generate_key_pair(os.environ["KEY"], os.environ["PUB"]))
PY
  chown -R "${uid}:0" "$(dirname "$key")" "$trusted"
fi
echo "[init] done"
