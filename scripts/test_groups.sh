#!/usr/bin/env bash
# The full run's integration tests (-m integration) as three pytest processes side by
# side; scripts/test.sh calls it once the service-free subset has passed. On one pytest process they
# took 72 minutes on 2 cores at a load average of about 1.5: they wait on services (Airflow's
# scheduler, Triton, MLflow, containers) far more than they compute. The groups share no state: each
# starts its own services on free ports, Airflow metadata databases and Celery queues are per
# deployment, and each group has its own temporary folder.
#   stack:       the compose tests that run the stack (marker docker), whose fixture waits for the
#                head start scripts/test.sh gave the stack, then, once that stack is removed, the
#                whole quick loop in a stack of its own (marker long): one stack at a time on 2 cores;
#   deployments: the local Airflow deployments, the demo and the UI (tests/tritonflow, tests/ui,
#                tests/test_demo.py);
#   rest:        everything else, in the foreground, its output as it comes.
# The background groups' output follows once the foreground group ends. Exit status: the first
# group's that failed; 5 (nothing collected) only when no group collected anything.
set -uo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d "${TMPDIR:-/tmp}/tritonflow-test-groups.XXXXXX")
selection="integration"
deployments=(tests/tritonflow tests/ui tests/test_demo.py)
names=(stack deployments)
pids=()
# The stack group's status: its first pytest process's unless that passed (0) and the second failed.
(
  .venv/bin/python -m pytest -p no:cacheprovider --basetemp "$work/stack" -m "$selection and docker and not long"
  first=$?
  .venv/bin/python -m pytest -p no:cacheprovider --basetemp "$work/stack-loop" -m "$selection and docker and long"
  second=$?
  if [ "$first" -ne 0 ] && [ "$first" -ne 5 ]; then exit "$first"; fi
  if [ "$second" -ne 0 ] && [ "$second" -ne 5 ]; then exit "$second"; fi
  if [ "$first" -eq 5 ] && [ "$second" -eq 5 ]; then exit 5; fi
  exit 0
) > "$work/stack.log" 2>&1 &
pids+=($!)
.venv/bin/python -m pytest -p no:cacheprovider --basetemp "$work/deployments" -m "$selection and not docker" \
  "${deployments[@]}" > "$work/deployments.log" 2>&1 &
pids+=($!)
echo "[test] integration tests in three groups side by side: stack and deployments in the background (logs in $work), the rest here"
ignore=()
for path in "${deployments[@]}"; do ignore+=(--ignore "$path"); done
.venv/bin/python -m pytest -m "$selection and not docker" "${ignore[@]}"
rcs=($?)
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  rcs+=($?)
  echo
  echo "================ group ${names[$i]} (run beside the rest): exit status ${rcs[-1]} ================"
  cat "$work/${names[$i]}.log"
done
echo "[test] exit status of the groups rest, ${names[*]}: ${rcs[*]}"
rc=5
for r in "${rcs[@]}"; do
  if [ "$r" -ne 0 ] && [ "$r" -ne 5 ]; then exit "$r"; fi
  if [ "$r" -eq 0 ]; then rc=0; fi
done
exit "$rc"
