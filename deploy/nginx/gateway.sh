#!/bin/sh
# Entry point of the `gateway` service (nginx image): starts the reload watcher in the background,
# then NGINX in the foreground. docker-compose.yaml runs it with `sh`, so it needs no exec bit.
set -eu
conf_dir="${TRITONFLOW_GATEWAY_CONF_DIR:-/etc/nginx/tritonflow}"
mkdir -p "$conf_dir/http.d" "$conf_dir/locations.d"
# The status log the router names in its snippets (access_log): NGINX opens it but does not create
# its folder, and `nginx -t` refuses a config whose log folder is missing.
if [ -n "${TRITONFLOW_GATEWAY_ACCESS_LOG:-}" ] && [ "$TRITONFLOW_GATEWAY_ACCESS_LOG" != "off" ]; then
    mkdir -p "$(dirname "$TRITONFLOW_GATEWAY_ACCESS_LOG")"
fi
# The watcher is a child of this shell, so of the NGINX master once it execs (the watcher knows).
sh "$(dirname "$0")/reload-watcher.sh" &
# NGINX_CMD: an argv prefix, as in the watcher (tests run this entry point under a local NGINX).
# shellcheck disable=SC2086
exec ${NGINX_CMD:-nginx} -g 'daemon off;'
