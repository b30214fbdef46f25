#!/usr/bin/env bash
# cluster.sh (make cluster-netns): make run's cluster — a router, two cells,
# a MariaDB per cell, memcached — as if on three hosts: each cell with its
# MariaDB, and the router with memcached, in a network namespace of its own
# with its own address on a bridge this script creates (deploy/netns/netns.sh),
# gossiping with memberlist across them. Needs root.
#
# Serves until SIGINT (Ctrl-C), SIGTERM or SIGHUP, then stops the router, the
# cells (draining), memcached and the databases, and removes the namespaces,
# the veths and the bridge; on any failure too, and a watchdog does it if this
# script is killed outright. State lives under ./var/netns (REDCELL_NETNS_VAR),
# apart from make run's; REDCELL_NETNS_ID (default "run") names the network
# (netns.sh: rc<ID>r, rc<ID>c1, rc<ID>c2, bridge rcbr<ID>, 10.213.N.0/24).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$root/deploy/local/services.sh"
netns=$here/netns.sh

# cluster.sh --watchdog PID VAR ID: started below in a session of its own;
# once PID is gone, stops what it left under VAR and removes network ID.
if [ "${1:-}" = --watchdog ]; then
  pid=$2 var=$3 id=$4
  while kill -0 "$pid" 2>/dev/null; do sleep 0.5; done
  echo "$(date -u +%FT%TZ) cluster.sh ($pid) is gone: stopping what it started under $var, removing network $id"
  stop_cluster "$var" || true
  "$netns" sweep || true # network $id if it was made: its owner, cluster.sh, has gone
  echo "$(date -u +%FT%TZ) stopped."
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "make cluster-netns needs root: it creates network namespaces, veth pairs and a bridge." >&2
  echo "Run it as root (sudo make cluster-netns), or use make run for a cluster on loopback." >&2
  exit 1
fi
command -v ip >/dev/null || { echo "make cluster-netns needs ip (iproute2)" >&2; exit 1; }

VAR=${REDCELL_NETNS_VAR:-$root/var/netns}
ID=${REDCELL_NETNS_ID:-run}
umask 077 # the config holds the cluster secret and the admin token
mkdir -p "$VAR/log" "$VAR/bin" "$VAR/pids"
VAR=$(cd "$VAR" && pwd) # absolute: processes are found by the paths on their command lines
ensure_packages

# Leftovers of an earlier run (a crash, a kill -9): its watchdog, its
# processes, and networks whose owner has gone (netns.sh sweep). A network
# $ID whose owner lives (another make cluster-netns) is left alone: up refuses.
stop_old_watchdog "$VAR" "cluster.sh --watchdog"
stop_cluster "$VAR"
"$netns" sweep
rm -f "$VAR"/pids/*.pid

stopping=0
netup=0       # 1 once netns.sh up has made network $ID
starting_db=0 # 1 while MariaDB servers are being started in background jobs
watchdog=""
shutdown() {
  # Once begun, it runs to the end (see deploy/local/run.sh).
  trap '' INT TERM HUP PIPE
  set +e
  [ "$stopping" = 1 ] && return 0
  stopping=1
  local down=()
  if [ "$netup" = 1 ]; then down=("$netns" down "$ID"); fi
  stop_run "$VAR" "$watchdog" "$starting_db" "router, then cells (draining), then memcached and MariaDB, then the network" "${down[@]}"
}
trap 'shutdown; exit 0' INT TERM HUP
trap shutdown EXIT

setsid "$here/cluster.sh" --watchdog $$ "$VAR" "$ID" >>"$VAR/log/watchdog.log" 2>&1 </dev/null &
watchdog=$!
echo "$watchdog" >"$VAR/pids/watchdog.pid"

echo "creating the network $ID (bridge, namespaces, veths) ..."
names=$("$netns" up "$ID" $$) # a failure stops here (set -e), where an eval of it would not
netup=1
eval "$names"                  # PREFIX, BRIDGE, HOST_IP, NS_r, IP_r, NS_c1, IP_c1, NS_c2, IP_c2

echo "building redcell ..."
(cd "$root" && go build -o "$VAR/bin/redcell" ./cmd/redcell)

# Every node has an address of its own, so each keeps make run's default ports.
token=${REDCELL_ADMIN_TOKEN:-$(random_hex 16)}
secret=${REDCELL_CLUSTER_SECRET:-$(random_hex 24)}
if [ ! -s "$VAR/identity-key" ]; then
  (umask 077 && random_hex 24 >"$VAR/identity-key")
fi
identity=$(cat "$VAR/identity-key")
cfg=$VAR/redcell.yaml
[ -f "$VAR/activities.yaml" ] || cp "$root/deploy/local/activities.yaml" "$VAR/activities.yaml"
[ -f "$VAR/coupons.yaml" ] || cp "$root/deploy/local/coupons.yaml" "$VAR/coupons.yaml"
[ -f "$VAR/reward-keys.yaml" ] || "$VAR/bin/redcell" rewards keygen --out "$VAR/reward-keys.yaml" >/dev/null
# Each of make run's loopback addresses becomes the address of the node that
# serves it.
sedargs=()
for p in 8080 7946 9200 21211; do sedargs+=(-e "s/127\.0\.0\.1:$p\b/$IP_r:$p/g"); done
for p in 9101 7947 9201 23061; do sedargs+=(-e "s/127\.0\.0\.1:$p\b/$IP_c1:$p/g"); done
for p in 9102 7948 9202 23062; do sedargs+=(-e "s/127\.0\.0\.1:$p\b/$IP_c2:$p/g"); done
sed "${sedargs[@]}" \
  -e "s/^admin_token: \"\"/admin_token: \"$token\"/" \
  -e "s/^cluster_secret: \"\"/cluster_secret: \"$secret\"/" \
  -e "s/^identity_key: \"\"/identity_key: \"$identity\"/" \
  "$root/deploy/local/redcell.yaml" >"$cfg"
if grep -q '127\.0\.0\.1' "$cfg"; then
  echo "$cfg still names 127.0.0.1 (deploy/local/redcell.yaml changed?):" >&2
  grep -n '127\.0\.0\.1' "$cfg" >&2
  exit 1
fi
keyfile=$VAR/api-key
ensure_demo_key "$VAR"

# on NODE CMD... runs CMD in NODE's namespace (r, c1, c2).
on() { local ns=NS_$1; shift; ip netns exec "${!ns}" "$@"; }

echo "starting MariaDB for cell-1 on $IP_c1:23061 and cell-2 on $IP_c2:23062 ..."
starting_db=1
on c1 env REDCELL_BIND_ADDR="$IP_c1" REDCELL_BINLOG_ID=1 bash -c '. "$1"; start_mariadb "$2" 23061 durable' _ \
  "$root/deploy/local/services.sh" "$VAR/cell-1/db" & m1=$!
on c2 env REDCELL_BIND_ADDR="$IP_c2" REDCELL_BINLOG_ID=2 bash -c '. "$1"; start_mariadb "$2" 23062 durable' _ \
  "$root/deploy/local/services.sh" "$VAR/cell-2/db" & m2=$!
wait "$m1" && wait "$m2" || { echo "MariaDB failed to start" >&2; exit 1; }
starting_db=0
on r env REDCELL_BIND_ADDR="$IP_r" bash -c '. "$1"; start_memcached "$2" 21211' _ \
  "$root/deploy/local/services.sh" "$VAR/memcached"

start_proc() {
  local node=$1 name=$2; shift 2
  local ns=NS_$node
  # ip netns exec runs the binary in place of itself: the command line
  # begins with $VAR/bin/redcell, as stop_cluster looks for.
  setsid ip netns exec "${!ns}" "$VAR/bin/redcell" "$@" >>"$VAR/log/$name.log" 2>&1 </dev/null &
  echo $! >"$VAR/pids/$name.pid"
}
start_proc c1 cell-1 cell --config "$cfg" --name cell-1
start_proc c2 cell-2 cell --config "$cfg" --name cell-2
start_proc r router router --config "$cfg"
procs=(cell-1 cell-2 router)

echo "waiting for the cluster to answer ..."
wait_serving "$VAR" "$IP_r:8080" "${procs[@]}" || exit 1
echo "the cells answer; waiting for them to finish creating day tables ..."
wait_schema "$IP_c1:9101" "$IP_c2:9102"

cat <<INFO

redcell is serving across network namespaces (network $ID: bridge $BRIDGE, $PREFIX.0/24; this host is $HOST_IP).
  router     http://$IP_r:8080   namespace $NS_r   (try: curl http://$IP_r:8080/healthz)
             admin $IP_r:9200, memcached $IP_r:21211, gossip $IP_r:7946
  cell-1     http://$IP_c1:9101  namespace $NS_c1  shards 0-499    MariaDB $IP_c1:23061, admin :9201, gossip :7947
  cell-2     http://$IP_c2:9102  namespace $NS_c2  shards 500-999  MariaDB $IP_c2:23062, admin :9202, gossip :7948
  API key    $keyfile: curl -H "Authorization: Bearer \$(cat $keyfile)" http://$IP_r:8080/v1/accounts/alice
  config     $cfg (admin token there)
  logs       $VAR/log/
  audit      $VAR/bin/redcell audit --config $cfg
  partition  ip link set $NS_c2 down   (cell-2 cut off; ip link set $NS_c2 up heals it)
  a shell    ip netns exec $NS_c1 bash  (inside cell-1's host)
Press Ctrl-C to stop.
INFO

while true; do
  for p in "${procs[@]}"; do
    if ! kill -0 "$(cat "$VAR/pids/$p.pid")" 2>/dev/null; then
      echo "$p exited unexpectedly; see $VAR/log/$p.log" >&2; exit 1
    fi
  done
  sleep 1
done
