#!/bin/sh
# One-shot MinIO initialisation, run by the `minio-init` service (minio/mc image). Idempotent.
#  - creates the buckets named in MINIO_BUCKETS (space-separated);
#  - writes a marker object at the Triton repository prefix: Triton refuses to start on an S3
#    repository path with no object under it ("repository path is not a valid directory"), and a
#    dot-file at the repository root is not a model (repository_sync.layout accepts it).
set -eu
: "${MINIO_ROOT_USER:?}" "${MINIO_ROOT_PASSWORD:?}" "${MINIO_BUCKETS:?}" "${TRITON_REPOSITORY_MARKER:?}"
mc alias set local "${MINIO_ENDPOINT:-http://minio:9000}" "$MINIO_ROOT_USER" "$MINIO_ROOT_PASSWORD" >/dev/null
for bucket in $MINIO_BUCKETS; do
  mc mb --ignore-existing "local/$bucket"
done
if ! mc stat "local/$TRITON_REPOSITORY_MARKER" >/dev/null 2>&1; then
  echo "tritonflow model repository (Triton needs one object under its repository prefix)" \
    | mc pipe "local/$TRITON_REPOSITORY_MARKER"
fi
echo "minio-init: buckets ready: $MINIO_BUCKETS"
