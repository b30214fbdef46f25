#!/usr/bin/env bash
# watchdog.sh VAR PID — run.sh starts it in a session of its own, so that a
# signal to run.sh's process group never reaches it. When run.sh (PID) is gone
# without having stopped the cluster — killed with SIGKILL along with its
# process group by a supervisor, say — it stops what run.sh started under VAR,
# in the same order (deploy/local/services.sh stop_cluster). After an orderly
# stop run.sh ends it with SIGTERM first.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/services.sh"
var=${1:?usage: watchdog.sh VAR PID} pid=${2:?usage: watchdog.sh VAR PID}
while kill -0 "$pid" 2>/dev/null; do sleep 0.5; done
echo "$(date -u +%FT%TZ) run.sh ($pid) is gone: stopping what it started under $var"
stop_cluster "$var"
echo "$(date -u +%FT%TZ) stopped."
