#!/usr/bin/env bash
# The docker-compose stack on this machine: scripts/stack.sh build|up|down|status|logs [SERVICE].
#
#   build   start dockerd if needed; make every image docker-compose.yaml names: the official base
#           images where present locally, else a documented stand-in of the same name built from a
#           debootstrapped Debian root (docs/stack.md); then tritonflow's own images. Every build is
#           `docker build --network none` from Debian packages and wheels fetched on the host into
#           TRITONFLOW_STACK_CACHE (default ~/.cache/tritonflow/stack: one cache per user, so a
#           fresh clone on the same machine fetches nothing again), reused across builds.
#   up      build, then `docker-compose up -d` with TRITONFLOW_STACK_WORKERS (2) Celery workers, and
#           wait until every service is healthy (or its one-shot job completed).
#   down    stop and remove the stack's containers (volumes too with --volumes).
#   status  each service's state and health.
#
# Production: with registry access, `docker-compose pull` first; official images present locally
# are always used as they are (TRITONFLOW_STACK_STANDINS=never refuses to build any stand-in).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=$(realpath -m "${TRITONFLOW_STACK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tritonflow/stack}")
PROJECT=${COMPOSE_PROJECT_NAME:-tritonflow}
WORKERS=${TRITONFLOW_STACK_WORKERS:-2}
STANDINS=${TRITONFLOW_STACK_STANDINS:-auto}
BASE_IMAGE=tritonflow/debian-base:bookworm
export COMPOSE_PROJECT_NAME=$PROJECT
# Debian packages of the stand-ins' root (one root shared by every stand-in image).
BASE_PACKAGES=python3,python3-venv,python3-pip,postgresql,postgresql-client,redis-server,redis-tools,nginx-light,prometheus,prometheus-nginx-exporter,curl,wget,ca-certificates,procps,tini,libgomp1,libb64-0d,openssl,iproute2,libpython3.11

log() { echo "[stack] $*" >&2; }
quiet_pip() { grep -v -e '^WARNING: Location' -e '^INFO: pip is looking' >&2 || true; }
# Extra compose files (colon-separated), e.g. the demo's settings override (tritonflow/demo/stack.py).
OVERRIDES=()
IFS=: read -r -a _extra <<< "${TRITONFLOW_STACK_OVERRIDES:-}"
for f in "${_extra[@]}"; do [ -n "$f" ] && OVERRIDES+=(-f "$f"); done
compose() { docker-compose -p "$PROJECT" -f docker-compose.yaml "${OVERRIDES[@]}" "$@"; }

# Official image name -> stand-in folder under deploy/standins (tests/compose checks the list
# covers every image docker-compose.yaml pulls).
STANDIN_IMAGES=(
  "postgres:16=postgres"
  "redis:7.2-bookworm=redis"
  "minio/minio:RELEASE.2025-09-07T16-13-09Z=s3"
  "minio/mc:RELEASE.2025-08-13T08-35-41Z=s3"
  "nvcr.io/nvidia/tritonserver:24.10-py3=triton"
  "nginx:1.27=nginx"
  "nginx/nginx-prometheus-exporter:1.4.2=nginx-exporter"
  "prom/prometheus:v3.5.0=prometheus"
  "apache/airflow:3.3.2-python3.11=airflow"
  "python:3.11-slim-bookworm=python"
)

ensure_docker() {
  if docker info >/dev/null 2>&1; then return; fi
  command -v dockerd >/dev/null || { log "no Docker engine: run scripts/setup.sh (installs docker.io)"; exit 1; }
  mkdir -p "$CACHE"
  log "starting dockerd (log $CACHE/dockerd.log)"
  nohup dockerd >"$CACHE/dockerd.log" 2>&1 &
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && return; sleep 1; done
  log "dockerd did not start: see $CACHE/dockerd.log"; tail -20 "$CACHE/dockerd.log" >&2; exit 1
}

have_image() { docker image inspect "$1" >/dev/null 2>&1; }
label_of() { docker image inspect -f "{{ index .Config.Labels \"org.tritonflow.inputs\" }}" "$1" 2>/dev/null || true; }
digest() { (cd "$ROOT" && find "$@" -type f ! -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16; }

# The host's Debian mirror (from its apt sources): the stand-ins' root comes from the same place.
debian_mirror() {
  local uri
  uri=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -1)
  [ -n "$uri" ] || uri=$(grep -hE '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | grep -v security | head -1)
  [ -n "$uri" ] || { log "no Debian mirror in /etc/apt/sources.list*"; exit 1; }
  echo "$uri"
}

build_base() {
  local want; want=$(echo "$BASE_PACKAGES" | sha256sum | cut -c1-16)
  if have_image "$BASE_IMAGE" && [ "$(label_of "$BASE_IMAGE")" = "$want" ]; then return; fi
  command -v debootstrap >/dev/null || { log "debootstrap missing: run scripts/setup.sh"; exit 1; }
  local root="$CACHE/rootfs"
  if [ "$(cat "$root.stamp" 2>/dev/null)" != "$want" ]; then
    log "debootstrap bookworm -> $root (about a minute)"
    rm -rf "$root" && mkdir -p "$root"
    debootstrap --variant=minbase --include="$BASE_PACKAGES" bookworm "$root" "$(debian_mirror)" >"$CACHE/debootstrap.log" 2>&1 \
      || { log "debootstrap failed: see $CACHE/debootstrap.log"; tail -5 "$CACHE/debootstrap.log" >&2; exit 1; }
    rm -f "$root"/var/cache/apt/archives/*.deb
    rm -rf "$root"/var/lib/apt/lists/*
    echo "$want" > "$root.stamp"
  fi
  log "docker import $BASE_IMAGE"
  tar -C "$root" -c . | docker import \
    -c 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c "LABEL org.tritonflow.inputs=$want org.tritonflow.standin=debian-root" \
    -c 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null
}

# The identity of the wheel set (what the images' labels record), known before anything is fetched.
wheels_id() { digest requirements.txt constraints requirements-triton.txt; }

# Wheels of requirements.txt (+ whylogs) and requirements-triton.txt, fetched on the host, only
# when an image has to be built (a checkout whose images are all current fetches nothing).
fetch_wheels() {
  local want; want=$(wheels_id)
  [ "$(cat "$CACHE/wheels.stamp" 2>/dev/null)" = "$want" ] && return
  local pip=("$ROOT/.venv/bin/python" -m pip)
  [ -x "$ROOT/.venv/bin/python" ] || pip=(python3 -m pip)
  log "fetching wheels on the host -> $CACHE/wheels, $CACHE/wheels-triton"
  mkdir -p "$CACHE/wheels" "$CACHE/wheels-triton"
  exec 3>&2 2> >(quiet_pip)
  "${pip[@]}" wheel -q -w "$CACHE/wheels" -r requirements.txt -c constraints/constraints.txt
  "${pip[@]}" wheel -q --no-deps -w "$CACHE/wheels" -r constraints/requirements-nodeps.txt
  "${pip[@]}" wheel -q -w "$CACHE/wheels-triton" -r requirements-triton.txt
  # The stand-ins run Debian 12's Python 3.11.2: what its markers add beyond the host's newer 3.11
  # (redis' async-timeout for python_full_version < "3.11.3"; pip evaluates markers for itself only).
  "${pip[@]}" wheel -q -w "$CACHE/wheels" "async-timeout>=4.0.3"
  echo "$want" > "$CACHE/wheels.stamp"
  exec 2>&3 3>&-
}

# docker build --network none from a context tar: build_from TAG DOCKERFILE LABEL -- tar arguments
build_from() {
  local tag=$1 dockerfile=$2 inputs=$3; shift 4
  fetch_wheels
  log "docker build --network none -t $tag ($dockerfile)"
  tar -c --dereference "$@" | DOCKER_BUILDKIT=0 docker build --network none -q -f "$dockerfile" \
    --label "org.tritonflow.inputs=$inputs" --build-arg PIP_OFFLINE=1 -t "$tag" - >/dev/null \
    2> >(grep -v -e DEPRECATED -e 'legacy builder' -e buildx -e BuildKit -e '^ *$' -e '^WARNING: Location' >&2)
}

declare -A BUILT_STANDINS=()

build_standin() {
  local image=$1 dir=$2 src="deploy/standins/$2" inputs
  inputs=$(digest "$src")-$(wheels_id)
  if have_image "$image"; then
    local label; label=$(label_of "$image")
    # An image that is not one of our stand-ins (the official one, pulled) is always kept.
    case "$label" in ""|"$inputs") return ;; esac
  fi
  [ "$STANDINS" = never ] && { log "$image is missing and TRITONFLOW_STACK_STANDINS=never"; exit 1; }
  # One stand-in serving two official names (minio and mc): built once, tagged twice.
  if [ -n "${BUILT_STANDINS[$dir]:-}" ]; then docker tag "${BUILT_STANDINS[$dir]}" "$image"; return; fi
  BUILT_STANDINS[$dir]=$image
  local ctx=(-C "$ROOT/$src" .)
  case "$dir" in
    triton) ctx+=(-C "$CACHE" wheels-triton --transform 's,^wheels-triton,wheels,'
                  -C "$ROOT" requirements-triton.txt -C "$ROOT/tritonflow/runtime" backends) ;;
    s3) ctx+=(-C "$CACHE" wheels) ;;
  esac
  build_from "$image" Dockerfile "$inputs" -- "${ctx[@]}"
}

build_project() {
  local tag=$1 dockerfile=$2 inputs
  inputs=$(digest "$dockerfile" requirements.txt constraints tritonflow model_registry drift_checks repository_sync ground)-$(wheels_id)
  have_image "$tag" && [ "$(label_of "$tag")" = "$inputs" ] && return
  build_from "$tag" "$dockerfile" "$inputs" -- --exclude='__pycache__' --exclude='*.pyc' \
    -C "$ROOT" requirements.txt constraints tritonflow model_registry drift_checks repository_sync ground "$dockerfile" \
    -C "$CACHE" wheels --transform 's,^wheels,deploy/wheels,'
}

cmd_build() {
  ensure_docker
  local t0=$SECONDS
  build_base
  local entry
  for entry in "${STANDIN_IMAGES[@]}"; do build_standin "${entry%%=*}" "${entry#*=}"; done
  build_project "${TRITONFLOW_AIRFLOW_IMAGE:-tritonflow/airflow:3.3.2}" deploy/airflow/Dockerfile
  build_project "${TRITONFLOW_MLFLOW_IMAGE:-tritonflow/mlflow:3.17.2}" deploy/mlflow/Dockerfile
  log "images ready ($((SECONDS - t0)) s)"
}

# Services expected to run (not the one-shot jobs) and their health: "name state health" lines.
service_health() {
  local id
  for id in $(compose ps -q); do
    docker inspect -f '{{ index .Config.Labels "com.docker.compose.service" }} {{ .State.Status }} {{ if .State.Health }}{{ .State.Health.Status }}{{ else }}none{{ end }} {{ .State.ExitCode }}' "$id"
  done
}

wait_healthy() {
  local deadline=$((SECONDS + ${TRITONFLOW_STACK_UP_TIMEOUT_S:-600})) lines bad
  while :; do
    lines=$(service_health)
    # A one-shot job that exited non-zero, or a service that is neither healthy nor a completed job.
    bad=$(echo "$lines" | awk '!(($2=="running" && ($3=="healthy" || $3=="none")) || ($2=="exited" && $4=="0"))')
    failed=$(echo "$lines" | awk '$2=="exited" && $4!="0" && $1 ~ /-init$/')
    if [ -n "$failed" ]; then log "one-shot job failed:"; echo "$failed" >&2; return 1; fi
    if [ -z "$bad" ] && [ -n "$lines" ]; then return 0; fi
    if [ "$SECONDS" -ge "$deadline" ]; then log "not healthy in time:"; echo "$bad" >&2; return 1; fi
    sleep 3
  done
}

# Why the stack is not up: every container's state, and for each one that is neither healthy nor a
# completed job its last health probes and the tail of its log (docker-compose says only
# "Container ... is unhealthy").
diagnose() {
  local id name
  compose ps >&2 || true
  for id in $(compose ps -q 2>/dev/null); do
    name=$(docker inspect -f '{{ .Name }} {{ .State.Status }} {{ if .State.Health }}{{ .State.Health.Status }}{{ else }}none{{ end }} {{ .State.ExitCode }}' "$id")
    echo "$name" | awk '{exit !(($2=="running" && ($3=="healthy" || $3=="none")) || ($2=="exited" && $4=="0"))}' && continue
    log "--- $name: last health probes"
    docker inspect -f '{{ if .State.Health }}{{ range .State.Health.Log }}{{ .Start }} exit {{ .ExitCode }}: {{ .Output }}
{{ end }}{{ end }}' "$id" | tail -n 12 >&2 || true
    log "--- $name: log tail"
    docker logs --tail 40 "$id" 2>&1 | tail -n 40 >&2 || true
  done
}

cmd_up() {
  cmd_build
  # NVIDIA recommends an unlimited memlock for Triton; where this host's hard limit is lower, a
  # container cannot raise it (runc: "error setting rlimit type 8"), so ask for the hard limit.
  if [ -z "${TRITON_MEMLOCK:-}" ] && [ "$(ulimit -Hl)" != unlimited ]; then
    TRITON_MEMLOCK=$(( $(ulimit -Hl) * 1024 )); export TRITON_MEMLOCK
  fi
  local t0=$SECONDS
  log "docker-compose up ($WORKERS Celery workers)"
  compose up -d --no-build --scale airflow-worker="$WORKERS" >&2 || { diagnose; exit 1; }
  wait_healthy || { diagnose; exit 1; }
  log "every service healthy ($((SECONDS - t0)) s after up)"
  compose ps >&2
}

case "${1:-}" in
  build) cmd_build ;;
  up) cmd_up ;;
  down) shift; ensure_docker; compose down "$@" ;;
  status) ensure_docker; service_health ;;
  logs) shift; ensure_docker; compose logs --no-color "$@" ;;
  *) echo "usage: scripts/stack.sh build|up|down [--volumes]|status|logs [SERVICE]" >&2; exit 2 ;;
esac
