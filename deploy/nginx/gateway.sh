#!/bin/sh
# Entry point of the `gateway` service (nginx image): starts the reload watcher in the background,
# then NGINX in the foreground. docker-compose.yaml runs it with `sh`, so it needs no exec bit.
set -eu
conf_dir="${TRITONFLOW_GATEWAY_CONF_DIR:-/etc/nginx/tritonflow}"
mkdir -p "$conf_dir/http.d" "$conf_dir/locations.d"
sh "$(dirname "$0")/reload-watcher.sh" &
exec nginx -g 'daemon off;'
