#!/usr/bin/env bash
# run.sh (make run): installs what is missing, then starts a local redcell cluster
# on loopback — two cells, each with its own MariaDB, one memcached, one router on
# :8080 — and serves until it is told to stop. SIGINT (Ctrl-C), SIGTERM (what
# timeout, a supervisor or a container stop sends, often to the whole process
# group) and SIGHUP (the terminal closed) all shut everything down in order: the
# router and cells finish in-flight requests and drain their queues, then memcached
# and the databases stop. A second signal during that shutdown is ignored, so it
# runs to the end. If this script is killed outright (SIGKILL), watchdog.sh, in a
# session of its own, stops the cluster instead. State lives under ./var
# (override with REDCELL_VAR).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$here/services.sh"

VAR=${REDCELL_VAR:-$root/var}
umask 077 # the config holds the cluster secret and the admin token; the key files, the keys' hashes
mkdir -p "$VAR/log" "$VAR/bin" "$VAR/pids"
VAR=$(cd "$VAR" && pwd) # absolute: processes are found by the paths on their command lines
ensure_packages
# REDCELL_STANDBY=1: each cell's MariaDB gets a standby (a semi-synchronous
# replica the cell promotes when its primary stays down).
standby=${REDCELL_STANDBY:-0}
# REDCELL_SPARE_CELL=1: a third cell, cell-3, with its own MariaDB, that owns
# no shards until redcell cells add moves databases to it (docs/operations.md).
spare=${REDCELL_SPARE_CELL:-0}
# REDCELL_CELL_PROCS=2: each cell runs a second process (slot b, ports of its
# own) that waits for the cell's lease and serves once the first process
# dies or hangs past lease_ttl (docs/operations.md, "A cell of two processes").
cellprocs=${REDCELL_CELL_PROCS:-1}
case "$cellprocs" in 1|2) ;; *) echo "REDCELL_CELL_PROCS must be 1 or 2" >&2; exit 1 ;; esac
# REDCELL_EXPORT_DAYS=N: the cells' export_days (the retention export: rows
# older than N days go to files under var/export/ and leave their tables;
# docs/operations.md, "Retention and export"). The config is written anew at
# every start, so set it here rather than in var/redcell.yaml.
exportdays=${REDCELL_EXPORT_DAYS:-0}
case "$exportdays" in '' | *[!0-9]*) echo "REDCELL_EXPORT_DAYS must be a number of days" >&2; exit 1 ;; esac
# Both together: cell-3 gets a standby of its own too, and databases move
# between cells with standbys (docs/operations.md, "Add a cell").
if [ "$standby" != 1 ] && { [ -f "$VAR/cell-1/standby/seeded" ] || [ -f "$VAR/cell-2/standby/seeded" ] || [ -f "$VAR/cell-3/standby/seeded" ]; }; then
  # Without its standby a cell would open its primary: after a failover that
  # is the stale copy, and even before one the standby would miss this run.
  echo "$VAR has standby databases: run with REDCELL_STANDBY=1 (or, to throw away its data, make clean)" >&2
  exit 1
fi

# Leftovers of an earlier run (a crash, a kill -9) are stopped first, the
# earlier run's watchdog included (it may be stopping them too).
stop_old_watchdog "$VAR" watchdog.sh
stop_cluster "$VAR"
rm -f "$VAR"/pids/*.pid

stopping=0
starting_db=0 # 1 while MariaDB servers are being started in background jobs
watchdog=""
shutdown() {
  # Once begun, the shutdown runs to the end: further INT, TERM and HUP are
  # ignored (GNU make forwards a TERM of its own to this script when its group
  # gets one), and so is a broken stdout (the terminal or the supervisor's
  # pipe gone). Ignored signals stay ignored in the commands run from here.
  trap '' INT TERM HUP PIPE
  set +e
  [ "$stopping" = 1 ] && return 0
  stopping=1
  # A MariaDB still starting is waited for (stop_run): a signal between
  # "start_mariadb ... &" and "m1=$!" finds the server's job running and
  # $m1 not set yet (stop_cluster then stopped its bootstrap, the second
  # attempt started a server after this script had gone).
  stop_run "$VAR" "$watchdog" "$starting_db" "router, then cells (draining), then memcached and MariaDB"
}
trap 'shutdown; exit 0' INT TERM HUP
trap shutdown EXIT

# The watchdog stops the cluster if this script dies without doing it.
setsid "$here/watchdog.sh" "$VAR" $$ >>"$VAR/log/watchdog.log" 2>&1 </dev/null &
watchdog=$!
echo "$watchdog" >"$VAR/pids/watchdog.pid"

echo "building redcell ..."
(cd "$root" && go build -o "$VAR/bin/redcell" ./cmd/redcell)

# Ports: the defaults from deploy/local/redcell.yaml unless already taken here.
db1=$(free_port 23061); db2=$(free_port $((db1 + 1)))
s1=""; s2="" # the standbys' ports
if [ "$standby" = 1 ]; then s1=$(free_port $((db2 + 100))); s2=$(free_port $((s1 + 1))); fi
mc=$(free_port 21211)
g0=$(free_port 7946); g1=$(free_port $((g0 + 1))); g2=$(free_port $((g1 + 1)))
c1=$(free_port 9101); c2=$(free_port $((c1 + 1)))
a0=$(free_port 9200); a1=$(free_port $((a0 + 1))); a2=$(free_port $((a1 + 1)))
db3=""; g3=""; c3=""; a3=""; s3="" # the spare cell's
if [ "$spare" = 1 ]; then
  db3=$(free_port $((db2 + 1))); g3=$(free_port $((g2 + 1))); c3=$(free_port $((c2 + 1))); a3=$(free_port $((a2 + 1)))
  if [ "$standby" = 1 ]; then s3=$(free_port $((s2 + 1))); fi
fi
# A fresh admin token each run (REDCELL_ADMIN_TOKEN to choose one).
token=${REDCELL_ADMIN_TOKEN:-$(random_hex 16)}
secret=${REDCELL_CLUSTER_SECRET:-$(random_hex 24)}
# The identity key must outlive restarts (it maps phones to actIDs): made once
# per state directory, or taken from REDCELL_IDENTITY_KEY the first time, and
# kept in $VAR/identity-key (make clean forgets it). A later
# REDCELL_IDENTITY_KEY that differs is refused: it would give every phone
# another act_id.
if [ ! -s "$VAR/identity-key" ]; then
  (umask 077 && printf %s "${REDCELL_IDENTITY_KEY:-$(random_hex 24)}" >"$VAR/identity-key")
fi
identity=$(cat "$VAR/identity-key")
if [ -n "${REDCELL_IDENTITY_KEY:-}" ] && [ "$REDCELL_IDENTITY_KEY" != "$identity" ]; then
  echo "REDCELL_IDENTITY_KEY differs from the key this state directory binds with ($VAR/identity-key); refusing to start" >&2
  exit 1
fi
if ! [[ "$identity" =~ ^[A-Za-z0-9_-]{16,}$ ]]; then
  echo "the identity key ($VAR/identity-key or REDCELL_IDENTITY_KEY) must be 16 or more of [A-Za-z0-9_-]" >&2
  exit 1
fi
rport=${REDCELL_ROUTER_PORT:-8080}
if ! port_free "$rport"; then echo "port $rport is taken; set REDCELL_ROUTER_PORT" >&2; exit 1; fi

cfg="$VAR/redcell.yaml"
# The reward activities: the operator edits var/activities.yaml and reloads it
# on the cells' admin ports; a later run keeps those edits.
if [ ! -f "$VAR/activities.yaml" ]; then cp "$here/activities.yaml" "$VAR/activities.yaml"; fi
# The coupon batches, the same way: var/coupons.yaml, reloaded on the cells'
# admin ports (POST /admin/coupons/reload).
if [ ! -f "$VAR/coupons.yaml" ]; then cp "$here/coupons.yaml" "$VAR/coupons.yaml"; fi
# The reward token keys (Ed25519, mode 0600): made once per state directory;
# rotate with redcell rewards rotate --keys var/reward-keys.yaml --id k2.
if [ ! -f "$VAR/reward-keys.yaml" ]; then "$VAR/bin/redcell" rewards keygen --out "$VAR/reward-keys.yaml" >/dev/null; fi
# Each default address becomes a token first, then its port: a port moved to
# the next one up is never moved again by the next default's substitution.
moves=(23061 "$db1" 23062 "$db2" 21211 "$mc" 7946 "$g0" 7947 "$g1" 7948 "$g2"
  9101 "$c1" 9102 "$c2" 8080 "$rport" 9200 "$a0" 9201 "$a1" 9202 "$a2")
sedargs=()
for ((i = 0; i < ${#moves[@]}; i += 2)); do
  sedargs+=(-e "s/127\.0\.0\.1:${moves[i]}\b/127.0.0.1:@${moves[i]}@/g")
done
for ((i = 0; i < ${#moves[@]}; i += 2)); do
  sedargs+=(-e "s/@${moves[i]}@/${moves[i + 1]}/g")
done
sed "${sedargs[@]}" \
    -e "s/^admin_token: \"\"/admin_token: \"$token\"/" \
    -e "s/^cluster_secret: \"\"/cluster_secret: \"$secret\"/" \
    -e "s/^identity_key: \"\"/identity_key: \"$identity\"/" \
    -e "s/^  export_days: 0 /  export_days: $exportdays /" \
    "$here/redcell.yaml" >"$cfg"
if [ "$spare" = 1 ]; then
  # cell-3 goes last in the cells list, owning nothing; the others find it by gossip.
  awk -v c="$c3" -v g="$g3" -v d="$db3" -v a="$a3" '/^cell:/ && !done {
    print "  - name: cell-3"
    print "    listen: \"127.0.0.1:" c "\""
    print "    gossip: \"127.0.0.1:" g "\""
    print "    shards: \"\"                          # none yet: redcell cells add --name cell-3 moves databases here"
    print "    dsn: \"root@tcp(127.0.0.1:" d ")/\""
    print "    standby_dsn: \"\""
    print "    admin_listen: \"127.0.0.1:" a "\""
    print ""
    done = 1
  } { print }' "$cfg" >"$cfg.tmp" && mv "$cfg.tmp" "$cfg"
fi
if [ "$standby" = 1 ]; then
  # Each cell's standby_dsn, in the order the cells are listed.
  awk -v a="root@tcp(127.0.0.1:$s1)/" -v b="root@tcp(127.0.0.1:$s2)/" -v c="root@tcp(127.0.0.1:$s3)/" \
    '/^    standby_dsn: ""/ { n++; sub(/""/, "\"" (n == 1 ? a : n == 2 ? b : c) "\"") } { print }' "$cfg" >"$cfg.tmp" && mv "$cfg.tmp" "$cfg"
fi

# The callers' API keys live in $VAR/api-keys.yaml (router.api_keys, hashes
# only). A demo app with every scope gets a key once, in $VAR/api-key, before
# the router starts; later runs keep using it (make clean forgets it).
# The router's degrade switches and anti-abuse rules (router.rules_file): a
# commented template the first time, read again by the router when it changes.
if [ ! -e "$VAR/rules.yaml" ]; then
  cat >"$VAR/rules.yaml" <<'RULES'
# Degrade switches and anti-abuse rules of the router (docs/operations.md,
# "Degrade and block at the router"). Saved changes apply within a second.
#
# admit:              # percent of a route's requests let through; 0 closes it
#   detail: 50
# retry_after: 5      # seconds a degraded answer asks clients to wait
# rules:              # the first rule that matches decides
#   - name: scraper
#     header: User-Agent
#     pattern: "(?i)python-requests"
#     action: block
#   - name: one-subnet
#     ips: ["198.51.100.0/24"]
#     action: limit
#     limit: {per_sec: 5, burst: 10, by: ip}
RULES
fi

keyfile="$VAR/api-key"
ensure_demo_key "$VAR"

echo "starting MariaDB for cell-1 on 127.0.0.1:$db1 and cell-2 on 127.0.0.1:$db2 ..."
# Server ids 1 and 2 (3 for the spare, 11-13 for the standbys), each its own
# GTID domain, each with a binlog: a database moves out of a cell's server by
# replication (redcell cells), and a standby replicates from it.
r1=""; r2=""; r3=""; b1=1; b2=2; b3=3
if [ "$standby" = 1 ]; then r1=1; r2=2; r3=3; b1=""; b2=""; b3=""; fi
starting_db=1
REDCELL_REPL_ID=$r1 REDCELL_BINLOG_ID=$b1 start_mariadb "$VAR/cell-1/db" "$db1" durable & m1=$!
REDCELL_REPL_ID=$r2 REDCELL_BINLOG_ID=$b2 start_mariadb "$VAR/cell-2/db" "$db2" durable & m2=$!
if [ "$spare" = 1 ]; then
  echo "starting MariaDB for the spare cell-3 on 127.0.0.1:$db3 ..."
  REDCELL_REPL_ID=$r3 REDCELL_BINLOG_ID=$b3 start_mariadb "$VAR/cell-3/db" "$db3" durable & m3=$!
fi
wait "$m1" && wait "$m2" && { [ "$spare" != 1 ] || wait "$m3"; } || { echo "MariaDB failed to start" >&2; exit 1; }
if [ "$standby" = 1 ]; then
  echo "starting the standbys: cell-1's on 127.0.0.1:$s1, cell-2's on 127.0.0.1:$s2 (semi-synchronous replicas) ..."
  start_standby "$VAR/cell-1/standby" "$s1" "$db1" 11 durable & m3=$!
  start_standby "$VAR/cell-2/standby" "$s2" "$db2" 12 durable & m4=$!
  m5=""
  if [ "$spare" = 1 ]; then
    echo "starting cell-3's standby on 127.0.0.1:$s3 ..."
    start_standby "$VAR/cell-3/standby" "$s3" "$db3" 13 durable & m5=$!
  fi
  wait "$m3" && wait "$m4" && { [ -z "$m5" ] || wait "$m5"; } || { echo "a standby failed to start" >&2; exit 1; }
fi
starting_db=0
start_memcached "$VAR/memcached" "$mc"

declare -A proc_args # each process's arguments (shell-quoted), to start a cell's process again
start_proc() {
  local name=$1; shift
  proc_args[$name]=$(printf '%q ' "$@")
  # setsid: Ctrl-C reaches this script only; shutdown() stops processes in order.
  setsid "$VAR/bin/redcell" "$@" >>"$VAR/log/$name.log" 2>&1 </dev/null &
  echo $! >"$VAR/pids/$name.pid"
}
# REDCELL_PPROF=1 serves Go profiles: router :6060, cell-1 :6061, cell-2 :6062.
p0=(); p1=(); p2=()
if [ "${REDCELL_PPROF:-}" = 1 ]; then
  p0=(--pprof 127.0.0.1:6060); p1=(--pprof 127.0.0.1:6061); p2=(--pprof 127.0.0.1:6062)
fi
start_proc cell-1 cell --config "$cfg" --name cell-1 "${p1[@]}"
start_proc cell-2 cell --config "$cfg" --name cell-2 "${p2[@]}"
procs=(cell-1 cell-2 router)
if [ "$spare" = 1 ]; then
  start_proc cell-3 cell --config "$cfg" --name cell-3
  procs+=(cell-3)
fi
start_proc router router --config "$cfg" "${p0[@]}"

echo "waiting for the cluster to answer ..."
wait_serving "$VAR" "127.0.0.1:$rport" "${procs[@]}" || exit 1
echo "the cells answer; waiting for them to finish creating day tables ..."
wait_schema "127.0.0.1:$c1" "127.0.0.1:$c2" ${c3:+"127.0.0.1:$c3"}

# The cells' second processes start once the first ones serve, so that the
# first take the leases.
second=()
if [ "$cellprocs" = 2 ]; then
  next=29100
  for c in cell-1 cell-2 ${c3:+cell-3}; do
    ports=$(free_port "$next")
    gp=$(free_port $((ports + 1))); ap=$(free_port $((gp + 1))); next=$((ap + 1))
    start_proc "${c}b" cell --config "$cfg" --name "$c" --proc b --listen "127.0.0.1:$ports" --gossip "127.0.0.1:$gp" --admin-listen "127.0.0.1:$ap"
    second+=("${c}b 127.0.0.1:$ports (gossip :$gp, admin :$ap)")
    procs+=("${c}b")
  done
fi
secondinfo=""
for x in "${second[@]}"; do secondinfo+=$'\n'"  second     $x (waits for its cell's lease; serves when the first process dies or hangs)"; done

cat <<INFO

redcell is serving.
  router     http://127.0.0.1:$rport        (public API; try: curl http://127.0.0.1:$rport/healthz)
  API key    $keyfile (app "demo", every scope); send it with each request:
               curl -H "Authorization: Bearer \$(cat $keyfile)" http://127.0.0.1:$rport/v1/accounts/alice
             more keys: $VAR/bin/redcell apikey add --keys $VAR/api-keys.yaml --app NAME --scopes read,open
  router admin 127.0.0.1:$a0 (GET /metrics; /admin/keys, /admin/rules with the admin token)
  router rules $VAR/rules.yaml (degrade switches per route, anti-abuse rules; read within a second of a change)
  cell-1     http://127.0.0.1:$c1   shards 0-499    MariaDB 127.0.0.1:$db1 ($VAR/cell-1/db)
  cell-2     http://127.0.0.1:$c2   shards 500-999  MariaDB 127.0.0.1:$db2 ($VAR/cell-2/db)${c3:+
  cell-3     http://127.0.0.1:$c3   no shards yet   MariaDB 127.0.0.1:$db3 ($VAR/cell-3/db), admin 127.0.0.1:$a3
             give it databases: $VAR/bin/redcell cells add --config $cfg --name cell-3}${s1:+
  standbys   cell-1 127.0.0.1:$s1 ($VAR/cell-1/standby), cell-2 127.0.0.1:$s2 ($VAR/cell-2/standby)${s3:+, cell-3 127.0.0.1:$s3 ($VAR/cell-3/standby)}}
  admin      127.0.0.1:$a1 (cell-1), 127.0.0.1:$a2 (cell-2)   token in $cfg$secondinfo
  memcached  127.0.0.1:$mc
  gossip     127.0.0.1:$g0 (router), :$g1, :$g2 (cells)
  config     $cfg
  logs       $VAR/log/
  audit      $VAR/bin/redcell audit --config $cfg
Press Ctrl-C to stop.
INFO

# Serve until Ctrl-C or until a process dies. With two processes per cell, a
# cell's process that exits (killed, or stopped because the other took the
# lease) is started again 10 s later, past the lease's 4 s, so that the
# other process has taken over meanwhile: the restarted one waits for the
# lease (a process restarted at once would take its own slot's lease back).
declare -A restart_at
while true; do
  for p in "${procs[@]}"; do
    if ! kill -0 "$(cat "$VAR/pids/$p.pid")" 2>/dev/null; then
      if [ "$cellprocs" = 2 ] && [ "$p" != router ]; then
        now=$(date +%s)
        if [ -z "${restart_at[$p]:-}" ]; then
          restart_at[$p]=$((now + 10))
          echo "$p exited; the other process of its cell takes over; starting $p again in 10 s (see $VAR/log/$p.log)" >&2
        elif [ "$now" -ge "${restart_at[$p]}" ]; then
          unset "restart_at[$p]"
          eval "start_proc \"\$p\" ${proc_args[$p]}"
        fi
        continue
      fi
      echo "$p exited unexpectedly; see $VAR/log/$p.log" >&2; exit 1
    fi
  done
  sleep 1
done
