#!/bin/sh
# Gateway reload watcher: lets containers that cannot signal NGINX (the Airflow workers) reload it.
#
# Protocol (files in the shared gateway config folder, TRITONFLOW_GATEWAY_CONF_DIR):
#   1. the client writes its snippets into http.d/ and locations.d/, then writes a fresh token
#      (one line of letters, digits, - or _, e.g. a UUID) to reload.request, atomically
#      (temporary file + rename);
#   2. this watcher sees a token it has not answered yet, writes reload-token.conf (served at
#      /gateway/reload-token), runs `nginx -t`, and when that passes `nginx -s reload`
#      (graceful: old workers finish their requests);
#   3. it waits until /gateway/reload-token answers the token, i.e. the new config is live;
#   4. it waits until the workers that ran before the reload have exited: a request they admitted
#      under the previous config may still be on its way to a version the client unloads next
#      (a canary's rollback unloads the challenger once this answer comes);
#   5. it writes "<token> ok" or "<token> failed" as the first line of reload.result
#      (atomically), followed by NGINX's own output. A client waits for its token and raises on
#      "failed", so repository_sync.routing.nginx_router.NginxRouter restores the previous snippets.
#
# Environment:
#   TRITONFLOW_GATEWAY_CONF_DIR        folder to watch (default /etc/nginx/tritonflow)
#   TRITONFLOW_GATEWAY_RELOAD_POLL_S   seconds between two looks at reload.request (default 1)
#   TRITONFLOW_GATEWAY_PROBE_URL       URL of the token location
#                                      (default http://127.0.0.1:8080/gateway/reload-token)
#   TRITONFLOW_GATEWAY_LIVE_TIMEOUT_S  whole seconds to wait for the new config to go live (default 15)
#   TRITONFLOW_GATEWAY_DRAIN_TIMEOUT_S whole seconds to wait for the old workers to exit (default 10);
#                                      past it the answer is still ok, with a line saying so
#   TRITONFLOW_GATEWAY_PID_FILE        the NGINX master's pid file (default /var/run/nginx.pid, as
#                                      deploy/nginx/nginx.conf's pid directive)
#   NGINX_CMD                          nginx argv prefix (default "nginx"; tests add -p/-c)
set -u
conf_dir="${TRITONFLOW_GATEWAY_CONF_DIR:-/etc/nginx/tritonflow}"
poll="${TRITONFLOW_GATEWAY_RELOAD_POLL_S:-1}"
probe="${TRITONFLOW_GATEWAY_PROBE_URL:-http://127.0.0.1:8080/gateway/reload-token}"
live_timeout="${TRITONFLOW_GATEWAY_LIVE_TIMEOUT_S:-15}"
drain_timeout="${TRITONFLOW_GATEWAY_DRAIN_TIMEOUT_S:-10}"
pid_file="${TRITONFLOW_GATEWAY_PID_FILE:-/var/run/nginx.pid}"
nginx_cmd="${NGINX_CMD:-nginx}"
request="$conf_dir/reload.request"
result="$conf_dir/reload.result"
token_conf="$conf_dir/reload-token.conf"
last=""

answer() {  # answer TOKEN STATUS OUTPUT
  printf '%s %s\n%s\n' "$1" "$2" "$3" > "$result.tmp.$$" && mv -f "$result.tmp.$$" "$result"
  echo "reload-watcher: $1 $2"
}

live() {  # live TOKEN: true once NGINX serves TOKEN at the probe URL 3 times in a row
  i=0
  seen=0
  while [ "$i" -lt "$((live_timeout * 10))" ]; do
    if [ "$(curl -fsS --max-time 2 "$probe" 2>/dev/null)" = "$1" ]; then
      seen=$((seen + 1))
      [ "$seen" -ge 3 ] && return 0
    else
      seen=0
      sleep 0.1
    fi
    i=$((i + 1))
  done
  return 1
}

workers() {  # PIDs of the NGINX master's nginx children (none when its pid file cannot be read)
  master=$(cat "$pid_file" 2>/dev/null) || return 0
  [ -n "$master" ] || return 0
  # Only the nginx ones: in the gateway container this watcher is a child of the master too.
  # cat, not awk on the files: a process may exit between the glob and the read.
  cat /proc/[0-9]*/status 2>/dev/null \
    | awk -v m="$master" '/^Name:/ {name = $2} /^Pid:/ {pid = $2} /^PPid:/ && $2 == m && name == "nginx" {print pid}'
}

drain() {  # drain PIDS: true once none of PIDS runs any more (a zombie counts as gone)
  i=0
  while [ "$i" -lt "$((drain_timeout * 10))" ]; do
    alive=""
    for p in $1; do
      grep -qs '^State:[[:space:]]*[^Z]' "/proc/$p/status" && alive="$alive $p"
    done
    [ -z "$alive" ] && return 0
    sleep 0.1
    i=$((i + 1))
  done
  return 1
}

echo "reload-watcher: watching $request every ${poll}s"
while :; do
  token=""
  if [ -f "$request" ]; then
    token=$(head -n 1 "$request" 2>/dev/null | tr -cd 'A-Za-z0-9_-')
  fi
  if [ -n "$token" ] && [ "$token" != "$last" ]; then
    last=$token
    printf 'return 200 "%s";\n' "$token" > "$token_conf.tmp.$$" && mv -f "$token_conf.tmp.$$" "$token_conf"
    old_workers=$(workers)
    # shellcheck disable=SC2086  # NGINX_CMD is an argv prefix
    if ! out=$($nginx_cmd -t 2>&1); then
      answer "$token" failed "$out"
    elif ! out2=$($nginx_cmd -s reload 2>&1); then
      answer "$token" failed "$out2"
    elif ! live "$token"; then
      answer "$token" failed "nginx -s reload was sent but $probe did not answer the new token within ${live_timeout}s"
    elif ! drain "$old_workers"; then
      answer "$token" ok "$out
old NGINX workers still running ${drain_timeout}s after the reload: requests they admitted under the previous config may be in flight"
    else
      answer "$token" ok "$out"
    fi
  fi
  sleep "$poll"
done
