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
# Again until nothing is left for 2 s (a MariaDB that run.sh was starting when
# it died comes up a little later), for a minute at most.
quiet=0
for i in $(seq 1 60); do
  stop_cluster "$var"
  if [ -z "$(cluster_pids "$var")" ]; then quiet=$((quiet + 1)); else quiet=0; fi
  [ "$quiet" -ge 2 ] && break
  sleep 1
done
echo "$(date -u +%FT%TZ) stopped."
