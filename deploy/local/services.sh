#!/usr/bin/env bash
# services.sh — functions that install and run redcell's local dependencies:
# private MariaDB instances and a memcached, each with its own data dir and port,
# and the steps of starting and stopping a cluster that run.sh and
# deploy/netns/cluster.sh share. Sourced by run.sh (make run), testenv.sh (make
# test) and cluster.sh (make cluster-netns). Nothing here touches a
# system-wide MariaDB or memcached: every instance lives under a folder we own.

# need_root_cmd prints "sudo" when the current user is not root.
need_root_cmd() { if [ "$(id -u)" -ne 0 ]; then echo sudo; fi; }

# ensure_packages installs mariadb-server, memcached and curl (run.sh waits for
# the cluster with it; the wrk helpers send with it) and, as root, iproute2,
# with apt-get if missing.
ensure_packages() {
  local missing=()
  command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server)
  command -v memcached >/dev/null 2>&1 || [ -x /usr/bin/memcached ] || missing+=(memcached)
  command -v mariadb-install-db >/dev/null 2>&1 || missing+=(mariadb-server)
  command -v curl >/dev/null 2>&1 || missing+=(curl)
  # ip (iproute2): the netns drills (root only) make namespaces, veths and a bridge.
  if [ "$(id -u)" -eq 0 ]; then command -v ip >/dev/null 2>&1 || missing+=(iproute2); fi
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]} with apt-get ..."
    local SUDO; SUDO=$(need_root_cmd)
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  ensure_wrk
  if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
    export PATH=$PATH:/usr/local/go/bin
  fi
}

# ensure_wrk installs wrk (an HTTP load generator) if missing and it can: make bench
# checks its own client against it. Optional: it never prompts (sudo -n) and never
# fails; without wrk, make bench skips that check and says so.
ensure_wrk() {
  command -v wrk >/dev/null 2>&1 && return 0
  command -v apt-get >/dev/null 2>&1 || return 0
  local SUDO=()
  if [ "$(id -u)" -ne 0 ]; then SUDO=(sudo -n); fi
  echo "installing wrk with apt-get (optional, for make bench) ..."
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null 2>&1 ||
    echo "note: wrk could not be installed; make bench skips its client check"
  return 0
}

mariadbd_bin() { command -v mariadbd 2>/dev/null || echo /usr/sbin/mariadbd; }

# port_free PORT [HOST] succeeds when nothing listens on HOST:PORT (127.0.0.1).
port_free() { ! (exec 3<>/dev/tcp/"${2:-127.0.0.1}"/"$1") 2>/dev/null; }

# free_port prints a free TCP port at or above $1.
free_port() {
  local p=$1
  while ! port_free "$p"; do p=$((p + 1)); done
  echo "$p"
}

# start_mariadb DIR PORT [durable|fast] starts a private MariaDB whose data, socket,
# pid and log live in DIR, listening on 127.0.0.1:PORT, root without password over TCP.
# REDCELL_BIND_ADDR=A.B.C.D (make cluster-netns: a namespace's address) listens on
# A.B.C.D:PORT instead and lets root in from A.B.C.0/24 too.
# "durable" keeps innodb_flush_log_at_trx_commit=1 (an fsync per commit); "fast"
# trades durability for test speed. Waits until it answers; returns non-zero on failure.
start_mariadb() {
  local dir=${1:?start_mariadb needs a directory} port=${2:?start_mariadb needs a port} mode=${3:-durable}
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  local user_opt=()
  if [ "$(id -u)" -eq 0 ]; then user_opt=(--user=root); fi
  # Its own temp dir, for the bootstrap too: a starting MariaDB deletes every
  # "#sql*" file in its tmpdir, so two bootstraps sharing /tmp (make run starts
  # two at once) delete each other's temporary tables and one fails with
  # "ERROR: 1051 Unknown table 'mysql.tmp_user_nopasswd'", and a bootstrap in
  # /tmp would delete the temporary tables of any other server using it.
  mkdir -p "$dir/tmp"
  # A bootstrap cut short (a signal during the first run) leaves data/mysql
  # behind; the marker, removed only after a bootstrap succeeded, says to redo it.
  if [ ! -d "$dir/data/mysql" ] || [ -f "$dir/installing" ]; then
    # Tried twice, in case the machine is short of something for a moment.
    local attempt
    touch "$dir/installing"
    for attempt in 1 2; do
      rm -rf "$dir/data"; mkdir -p "$dir/data"
      if mariadb-install-db --no-defaults "${user_opt[@]}" --datadir="$dir/data" --tmpdir="$dir/tmp" \
        --auth-root-authentication-method=normal --skip-test-db >"$dir/install.log" 2>&1; then
        rm -f "$dir/installing"
        break
      fi
      echo "mariadb-install-db failed (attempt $attempt) in $dir:" >&2
      tail -15 "$dir/install.log" >&2
      [ "$attempt" = 2 ] && return 1
      sleep 1
    done
  fi
  if [ -f "$dir/mariadb.pid" ] && kill -0 "$(cat "$dir/mariadb.pid")" 2>/dev/null; then
    kill "$(cat "$dir/mariadb.pid")" 2>/dev/null; sleep 1
  fi
  local flush=1 sync=1
  if [ "$mode" = fast ]; then flush=2; sync=0; fi
  # REDCELL_REPL_ID=N: this server takes part in replication (a cell's primary
  # with a standby, or the standby): binlog, server id N, semi-synchronous.
  local repl=()
  if [ -n "${REDCELL_REPL_ID:-}" ]; then
    # The standby acknowledges a transaction's events once it has written
    # them (AFTER_SYNC), before the primary answers its COMMIT: a COMMIT
    # acknowledged to the cell is on the standby too. A standby silent for
    # REDCELL_SEMISYNC_TIMEOUT_MS (10 s) turns this into asynchronous
    # replication until it is back (docs/operations.md says what that risks).
    repl=(--log-bin=binlog --server-id="$REDCELL_REPL_ID" --gtid-domain-id="$REDCELL_REPL_ID" --binlog-format=ROW --log-slave-updates=1
      --rpl-semi-sync-master-enabled=1 --rpl-semi-sync-slave-enabled=1 --rpl-semi-sync-master-wait-point=AFTER_SYNC
      --rpl-semi-sync-master-timeout="${REDCELL_SEMISYNC_TIMEOUT_MS:-10000}" --slave-parallel-threads=4 --slave-parallel-mode=optimistic)
  elif [ -n "${REDCELL_BINLOG_ID:-}" ]; then
    # REDCELL_BINLOG_ID=N: a binlog (ROW) and server id N, no standby: what a
    # move of a database out of this server replicates from (redcell cells).
    repl=(--log-bin=binlog --server-id="$REDCELL_BINLOG_ID" --gtid-domain-id="$REDCELL_BINLOG_ID" --binlog-format=ROW --log-slave-updates=1 --expire-logs-days=2)
  fi
  # The socket path is kept short: unix sockets are limited to 108 bytes. A
  # server killed outright left its last one behind: gone with it now.
  if [ -f "$dir/socket.path" ]; then rm -f "$(cat "$dir/socket.path")"; fi
  local sock; sock=$(mktemp -u /tmp/rcdb.XXXXXX.sock)
  echo "$sock" >"$dir/socket.path"
  # setsid: a Ctrl-C in the terminal reaches run.sh only, which stops things in order.
  setsid "$(mariadbd_bin)" --no-defaults "${user_opt[@]}" --datadir="$dir/data" \
    --port="$port" --bind-address="${REDCELL_BIND_ADDR:-127.0.0.1}" --socket="$sock" --pid-file="$dir/mariadb.pid" --tmpdir="$dir/tmp" \
    --log-error="$dir/error.log" --skip-name-resolve --max-connections=1000 \
    --innodb-buffer-pool-size=256M --innodb-log-file-size=256M \
    --innodb-flush-log-at-trx-commit=$flush --sync-binlog=$sync "${repl[@]}" \
    --innodb-file-per-table=${REDCELL_FILE_PER_TABLE:-1} --table-open-cache=8000 --table-definition-cache=8000 \
    --open-files-limit=32000 --character-set-server=utf8mb4 \
    --collation-server=utf8mb4_bin >/dev/null 2>&1 &
  local i bind=${REDCELL_BIND_ADDR:-127.0.0.1}
  for i in $(seq 1 120); do
    if [ "$bind" != 127.0.0.1 ]; then
      # root is root@localhost only: on another address it is given to the
      # address's /24 as well (the namespaces' bridge), through the socket.
      mariadb --no-defaults -S"$sock" -uroot -e "CREATE USER IF NOT EXISTS 'root'@'${bind%.*}.%';
        GRANT ALL PRIVILEGES ON *.* TO 'root'@'${bind%.*}.%' WITH GRANT OPTION" >/dev/null 2>&1 || { sleep 0.5; continue; }
    fi
    if mariadb --no-defaults -h"$bind" -P"$port" -uroot -e 'SELECT 1' >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.5
  done
  echo "MariaDB in $dir did not answer on port $port; see $dir/error.log" >&2
  tail -20 "$dir/error.log" >&2 || true
  return 1
}

# start_standby DIR PORT PRIMARY_PORT ID [durable|fast] starts a private MariaDB
# in DIR on PORT as the standby of the server on PRIMARY_PORT (started with
# REDCELL_REPL_ID): a replica by GTID with semi-synchronous acknowledgement,
# server id ID. A new standby is first seeded with a consistent copy of the
# primary's redcell databases (mariadb-dump --single-transaction, which also
# gives the GTID position to start from). A standby that was promoted (it
# was seeded, and replicates from nobody now) is the cell's database: it is
# started as it is, never seeded again, and a warning says so. A standby does
# not acknowledge semi-synchronously itself (rpl_semi_sync_master_enabled 0:
# with it on and no replica of its own, the first transaction it applies
# would wait the whole timeout); a promotion leaves it off, fail-back turns it
# on again.
start_standby() {
  local dir=${1:?} port=${2:?} primary=${3:?} id=${4:?} mode=${5:-durable}
  REDCELL_REPL_ID=$id start_mariadb "$dir" "$port" "$mode" || return 1
  local m=(mariadb --no-defaults -h127.0.0.1 -uroot) status
  status=$("${m[@]}" -P"$port" -N -e 'SHOW SLAVE STATUS') || { echo "cannot ask the standby in $dir whether it replicates" >&2; return 1; }
  if [ -n "$status" ]; then
    # A replica already: pointed at this primary's port (a later run may
    # have given the primary another), it reconnects and goes on by GTID.
    "${m[@]}" -P"$port" -e "STOP SLAVE; CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=$primary; SET GLOBAL rpl_semi_sync_master_enabled = 0; START SLAVE" || return 1
    return 0
  fi
  if [ -f "$dir/seeded" ]; then
    echo "warning: the standby in $dir replicates from nobody: it was promoted and is the cell's database now;" >&2
    echo "         the server on $primary is behind it (rebuild it as the standby, docs/operations.md)" >&2
    return 0
  fi
  # Every schema but the server's own: the cells' db_XX and shadow_db_XX, and
  # their redcell_meta (reconciliation positions), which a replica without
  # them would stop at; not redcell_failover, the mark a promotion leaves.
  local dbs pos
  dbs=$("${m[@]}" -P"$primary" -N -e "SELECT schema_name FROM information_schema.schemata
    WHERE schema_name NOT IN ('mysql', 'information_schema', 'performance_schema', 'sys', 'redcell_failover')") || return 1
  dbs=$(tr '\n' ' ' <<<"$dbs")
  if [ -n "${dbs// /}" ]; then
    # shellcheck disable=SC2086 # one word per database
    mariadb-dump --no-defaults -h127.0.0.1 -P"$primary" -uroot --single-transaction --gtid --master-data=1 \
      --databases $dbs >"$dir/seed.sql" || { echo "dumping the primary on $primary for the standby in $dir failed" >&2; return 1; }
    # Loaded without writing the standby's own binlog: its GTIDs stay the primary's.
    { echo "SET SESSION sql_log_bin = 0;"; cat "$dir/seed.sql"; } | "${m[@]}" -P"$port" ||
      { echo "seeding the standby in $dir failed" >&2; return 1; }
    rm -f "$dir/seed.sql"
  else
    pos=$("${m[@]}" -P"$primary" -N -e 'SELECT @@gtid_binlog_pos') || return 1
    "${m[@]}" -P"$port" -e "SET GLOBAL gtid_slave_pos = '$pos'" || return 1
  fi
  "${m[@]}" -P"$port" -e "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=$primary, MASTER_USER='root',
    MASTER_PASSWORD='', MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1; SET GLOBAL rpl_semi_sync_master_enabled = 0; START SLAVE" || return 1
  touch "$dir/seeded"
}

# pids_with TEXT [start] prints the pids of the processes whose command line
# contains TEXT (a private data dir, say), or with "start" begins with it (a
# program's path and first argument). TEXT travels in the environment, so
# neither ps nor awk matches itself.
pids_with() {
  # A failed ps is a failure, not "none running": stop_with must not take it
  # for a cluster already stopped.
  local list
  list=$(ps -eo pid=,args=) || return 1
  printf '%s\n' "$list" | TEXT=$1 AT=${2:-} awk '{
    pid = $1; sub(/^[ \t]*[0-9]+[ \t]+/, "")
    i = index($0, ENVIRON["TEXT"])
    if (ENVIRON["AT"] == "start" ? i == 1 : i > 0) print pid
  }'
}

# stop_with TEXT SECONDS [start] sends SIGTERM to the processes pids_with
# names, waits up to SECONDS for them to exit, then kills what is left.
stop_with() {
  local text=$1 secs=$2 at=${3:-} pids="" i
  for i in 1 2 3 4 5; do # ps itself may fail on a loaded machine: ask again
    pids=$(pids_with "$text" "$at") && break
    sleep 0.2
  done
  [ -n "$pids" ] || return 0
  kill $pids 2>/dev/null || true
  for i in $(seq 1 $((secs * 4))); do
    if pids=$(pids_with "$text" "$at") && [ -z "$pids" ]; then return 0; fi
    sleep 0.25
  done
  pids=$(pids_with "$text" "$at") || true
  echo "still running after ${secs}s, killed: $text" >&2
  kill -9 $pids 2>/dev/null || true
}

# stop_mariadb DIR stops the instance started in DIR and waits for it to exit.
# It finds the server by its data dir, which no other process names, so a
# stale or missing pid file (a server killed while it started) changes nothing.
stop_mariadb() {
  local dir=$1
  [ -d "$dir" ] || return 0
  dir=$(cd "$dir" && pwd)
  stop_with "--datadir=$dir/data " 30
  # Its socket, if it was killed outright and left it behind.
  if [ -f "$dir/socket.path" ]; then rm -f "$(cat "$dir/socket.path")"; fi
}

# start_memcached DIR PORT starts a private memcached on 127.0.0.1:PORT
# (REDCELL_BIND_ADDR:PORT when set).
start_memcached() {
  local dir=$1 port=$2
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  stop_memcached "$dir" # one left from an earlier run
  local user_opt=()
  if [ "$(id -u)" -eq 0 ]; then user_opt=(-u root); fi
  local host=${REDCELL_BIND_ADDR:-127.0.0.1}
  memcached "${user_opt[@]}" -l "$host" -p "$port" -U 0 -m 128 -c 4096 -d -P "$dir/memcached.pid"
  local i
  for i in $(seq 1 40); do
    if ! port_free "$port" "$host"; then return 0; fi
    sleep 0.25
  done
  echo "memcached did not start on port $port" >&2
  return 1
}

# stop_memcached DIR stops the memcached started in DIR and waits for it to exit,
# so that its port is free when this returns. It finds the process by its pid
# file's path on its command line, never by a pid that may have been reused.
stop_memcached() {
  local dir=$1
  [ -d "$dir" ] || return 0
  dir=$(cd "$dir" && pwd)
  stop_with "-P $dir/memcached.pid" 10
  rm -f "$dir/memcached.pid"
}

# stop_cluster VAR stops what deploy/local/run.sh started with its state in VAR,
# in order: the router (in-flight requests finish), the cells (they leave the
# cluster and drain their queues), then memcached and both MariaDB servers.
# Processes are found by their command lines, which name VAR, so it stops
# them whether or not their pid files survived and touches nothing else.
# Stopping what is not running does nothing.
stop_cluster() {
  local var=$1
  stop_with "$var/bin/redcell router " 20 start
  stop_with "$var/bin/redcell cell " 30 start
  stop_memcached "$var/memcached"
  local d pids=()
  for d in cell-1/db cell-1/standby cell-2/standby cell-3/db cell-3/standby; do
    stop_mariadb "$var/$d" & pids+=($!) # all at once: each flushes for a few seconds
  done
  stop_mariadb "$var/cell-2/db"
  wait "${pids[@]}" || true
}

# cluster_pids VAR prints the pids of what run.sh started under VAR that still runs.
cluster_pids() {
  local var=$1
  # "?" when ps failed: unknown is not "nothing left".
  pids_with "$var/bin/redcell router " start || echo "?"
  pids_with "$var/bin/redcell cell " start || echo "?"
  pids_with "-P $var/memcached/memcached.pid" || echo "?"
  pids_with "--datadir=$var/cell-1/db/data " || echo "?"
  pids_with "--datadir=$var/cell-2/db/data " || echo "?"
  pids_with "--datadir=$var/cell-1/standby/data " || echo "?"
  pids_with "--datadir=$var/cell-2/standby/data " || echo "?"
  pids_with "--datadir=$var/cell-3/db/data " || echo "?"
  pids_with "--datadir=$var/cell-3/standby/data " || echo "?"
}

# ---- Steps run.sh and deploy/netns/cluster.sh share ----

# random_hex N prints N random bytes in hex (a fresh token or secret).
random_hex() { head -c "$1" /dev/urandom | od -An -tx1 | tr -d ' \n'; }

# stop_old_watchdog VAR WHAT stops the watchdog an earlier run left under VAR
# (VAR/pids/watchdog.pid) when that pid's command line holds WHAT; a pid that
# another process has taken since is left alone.
stop_old_watchdog() {
  local var=$1 what=$2 old
  [ -f "$var/pids/watchdog.pid" ] || return 0
  old=$(cat "$var/pids/watchdog.pid")
  case "$(ps -p "$old" -o args= 2>/dev/null)" in *"$what"*) kill "$old" 2>/dev/null || true ;; esac
}

# stop_run VAR WATCHDOG STARTING WHAT [CMD...] is the shutdown of a run
# under VAR once begun: it says it stops WHAT; when STARTING is 1 (a signal
# during the start of the MariaDB servers) it waits for every background
# job of the calling shell but its watchdog WATCHDOG, all of them the
# servers' (the jobs are listed, not taken from the script's $m1..: the
# signal can come between "start_mariadb ... &" and "m1=$!"), so that they
# are there to be stopped (start_mariadb gives up within a minute); then it
# stops the cluster (stop_cluster), runs CMD (cluster.sh: the network's
# removal), stops the watchdog, its work done, and removes the pid files.
stop_run() {
  local var=$1 watchdog=$2 starting=$3 what=$4 job
  shift 4
  echo
  echo "shutting down: $what ..."
  if [ "$starting" = 1 ]; then
    for job in $(jobs -p); do
      [ "$job" = "$watchdog" ] || wait "$job" 2>/dev/null
    done
  fi
  stop_cluster "$var"
  if [ $# -gt 0 ]; then "$@"; fi
  if [ -f "$var/pids/watchdog.pid" ]; then kill "$(cat "$var/pids/watchdog.pid")" 2>/dev/null; fi
  rm -f "$var"/pids/*.pid
  echo "stopped."
}

# ensure_demo_key VAR gives the demo app a key with every scope, in
# VAR/api-key (its hash in VAR/api-keys.yaml, router.api_keys), unless the
# key there is still active with the newest scopes; VAR/bin/redcell runs it.
ensure_demo_key() {
  local var=$1 keys
  keys=$("$var/bin/redcell" apikey list --keys "$var/api-keys.yaml") # whole, before grep: no early exit under pipefail
  # A key made before the newest scopes existed (reward, withdraw, coupon) is replaced.
  if [ ! -s "$var/api-key" ] || ! grep -q "^$(cut -d_ -f2 "$var/api-key") .*scopes=[^ ]*coupon.* active$" <<<"$keys"; then
    "$var/bin/redcell" apikey add --keys "$var/api-keys.yaml" --app demo --scopes all --out "$var/api-key"
  fi
}

# wait_serving VAR ROUTER PROC... waits up to a minute for the router at
# ROUTER (host:port) to cover every shard. It fails (returns 1, saying why)
# as soon as a process PROC (a pid file VAR/pids/PROC.pid, its log
# VAR/log/PROC.log) has exited, or when the minute is up.
wait_serving() {
  local var=$1 router=$2 i p
  shift 2
  for i in $(seq 1 120); do
    if curl -fsS "http://$router/healthz" 2>/dev/null | grep -q '"uncovered_shards":0'; then return 0; fi
    for p in "$@"; do
      if ! kill -0 "$(cat "$var/pids/$p.pid")" 2>/dev/null; then
        echo "$p exited; last lines of $var/log/$p.log:" >&2; tail -20 "$var/log/$p.log" >&2; return 1
      fi
    done
    sleep 0.5
  done
  echo "cluster did not become ready; see $var/log/" >&2
  return 1
}

# wait_schema CELL... waits, up to two minutes each, for the cells at CELL
# (host:port) to have made their day tables: they serve at once, and make
# today's and tomorrow's tables for every shard they own in the background
# (the first run makes a few thousand).
wait_schema() {
  local c i
  for c in "$@"; do
    for i in $(seq 1 240); do
      curl -fsS "http://$c/healthz" 2>/dev/null | grep -q '"schema_ready":true' && break
      sleep 0.5
    done
  done
}
