#!/usr/bin/env bash
# netns.sh — the network of the multi-host rehearsal on one machine (make
# cluster-netns, and TestDrillNetns in cmd/redcell): a bridge and three
# network namespaces, each a "host" with an address of its own. Needs root.
#
#   netns.sh up ID [PID]    create them (refused if any exists or the subnet is in use),
#                           owned by process PID (default: the caller)
#   netns.sh down ID        stop every process in them and remove them (idempotent;
#                           after a crash too)
#   netns.sh sweep          down every ID whose owner has gone (a test killed at its
#                           timeout, a make cluster-netns and its watchdog killed -9)
#   netns.sh link ID NODE up|down
#                           set NODE's link (the host end of its veth) up or down:
#                           down cuts NODE off from every other node (a partition)
#   netns.sh names ID       print what up creates, as KEY=VALUE lines
#
# ID is 1 to 6 of [a-z0-9]; every name carries it, so down finds what an
# earlier run left whatever happened to it:
#
#   rcbr<ID>      the bridge, 10.213.N.1/24 (N from ID: 10..249); the host's
#                 only address on it
#   rc<ID>r       namespace of the router (and memcached): 10.213.N.10
#   rc<ID>c1      namespace of cell-1 and its MariaDB: 10.213.N.11
#   rc<ID>c2      namespace of cell-2 and its MariaDB: 10.213.N.12
#
# Each namespace has lo up and one veth pair: eth0 inside, the host end named
# as the namespace, on the bridge. No namespace has a default route and the
# host does not forward for the bridge, so nothing sent in a namespace leaves
# 10.213.N.0/24.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

cmd=${1:-}
id=${2:-}
# The owner of each network: /run/redcell-netns/ID holds its pid and start
# time (a tmpfs: gone at a reboot, as the namespaces are).
owners=/run/redcell-netns
if [ "$cmd" = sweep ]; then id=sweep; fi
[ -n "$cmd" ] && [ -n "$id" ] || usage
if ! [[ "$id" =~ ^[a-z0-9]{1,6}$ ]]; then
  echo "netns.sh: ID must be 1 to 6 of [a-z0-9], got \"$id\"" >&2
  exit 2
fi

nodes=(r c1 c2)
# The last octet of each node's address.
declare -A octet=([r]=10 [c1]=11 [c2]=12)
bridge=rcbr$id
n=$(($(printf %s "$id" | cksum | cut -d' ' -f1) % 240 + 10))
prefix=10.213.$n

need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "netns.sh: needs root (network namespaces, veth pairs and a bridge)" >&2
    exit 1
  fi
  command -v ip >/dev/null || { echo "netns.sh: needs ip (iproute2)" >&2; exit 1; }
}

names() {
  echo "PREFIX=$prefix"
  echo "BRIDGE=$bridge"
  echo "HOST_IP=$prefix.1"
  local node
  for node in "${nodes[@]}"; do
    echo "NS_$node=rc$id$node"
    echo "IP_$node=$prefix.${octet[$node]}"
  done
}

# ns_pids NS prints the pids of the processes in namespace NS.
ns_pids() { ip netns pids "$1" 2>/dev/null || true; }

# alive PID... prints those of the pids that still run (zombies do not).
alive() {
  local p
  for p in "$@"; do
    [ -r "/proc/$p/stat" ] || continue
    case "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" in Z | "") ;; *) echo "$p" ;; esac
  done
}

# stop_pids SECONDS PID... sends SIGTERM, waits up to SECONDS, then SIGKILL.
stop_pids() {
  local secs=$1 i left
  shift
  [ $# -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null || true
  for ((i = 0; i < secs * 4; i++)); do
    left=$(alive "$@")
    [ -n "$left" ] || return 0
    sleep 0.25
  done
  echo "netns.sh: still running after ${secs}s, killed: $(echo $left)" >&2
  # shellcheck disable=SC2086 # one word per pid
  kill -KILL $left 2>/dev/null || true
  sleep 0.5
}

down() {
  need_root
  local node ns p pids=() first=()
  for node in "${nodes[@]}"; do
    ns=rc$id$node
    for p in $(ns_pids "$ns"); do
      pids+=("$p")
      # redcell processes first (router and cells leave gossip and drain),
      # then what they use (MariaDB, memcached, a drill's toxiproxy).
      [ "$(cat "/proc/$p/comm" 2>/dev/null)" = redcell ] && first+=("$p")
    done
  done
  stop_pids 30 "${first[@]}"
  stop_pids 30 $(alive "${pids[@]}")
  for node in "${nodes[@]}"; do
    ns=rc$id$node
    if ip netns list | awk '{print $1}' | grep -qx "$ns"; then ip netns delete "$ns"; fi
    # The host end goes with the namespace, but not at once: it may vanish
    # between the look and the delete ("Cannot find device"), which is fine.
    if ip link show "$ns" >/dev/null 2>&1; then ip link delete "$ns" 2>/dev/null || true; fi
  done
  if ip link show "$bridge" >/dev/null 2>&1; then ip link delete "$bridge" 2>/dev/null || true; fi
  rm -f "$owners/$id"
  # Nothing of ID may be left (veths of deleted namespaces go within moments).
  local left i
  for i in $(seq 1 50); do
    left=$( { ip netns list | awk '{print $1}' | grep -E "^rc$id(r|c1|c2)$" || true; } )
    left+=$( { ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^(rc$id(r|c1|c2)|$bridge)$" || true; } )
    [ -z "$left" ] && break
    if [ "$i" = 25 ]; then # still there: delete what is left once more
      for node in "${nodes[@]}"; do ip link delete "rc$id$node" 2>/dev/null || true; done
      ip link delete "$bridge" 2>/dev/null || true
    fi
    sleep 0.1
  done
  if [ -n "$left" ]; then
    echo "netns.sh: could not remove: $(echo $left)" >&2
    exit 1
  fi
}

# in_use reports why 10.213.N.0/24 cannot be ours: an address in it, or a
# route covering it or inside it (the default route aside).
in_use() {
  local r
  r=$(ip -4 addr show to "$prefix.0/24")
  [ -z "$r" ] || { echo "an address in $prefix.0/24 exists: $r"; return 0; }
  r=$(ip -4 route show table all match "$prefix.0/24" | grep -v '^default' || true)
  r+=$(ip -4 route show table all root "$prefix.0/24" | grep -v "^broadcast\|^local" || true)
  [ -z "$r" ] || { echo "$prefix.0/24 is routed: $r"; return 0; }
  return 1
}

up() {
  need_root
  local node ns why
  for node in "${nodes[@]}"; do
    ns=rc$id$node
    if ip netns list | awk '{print $1}' | grep -qx "$ns" || ip link show "$ns" >/dev/null 2>&1; then
      echo "netns.sh: $ns exists (netns.sh down $id removes what an earlier run left)" >&2
      exit 1
    fi
  done
  if ip link show "$bridge" >/dev/null 2>&1; then
    echo "netns.sh: $bridge exists (netns.sh down $id removes what an earlier run left)" >&2
    exit 1
  fi
  if why=$(in_use); then
    echo "netns.sh: refusing ID $id: $why" >&2
    exit 1
  fi
  # A failure half-way removes what was made.
  trap 'echo "netns.sh: up $id failed; removing what it made" >&2; down' ERR
  local owner=${3:-$PPID}
  mkdir -p "$owners"
  echo "$owner $(started "$owner")" >"$owners/$id"
  ip link add "$bridge" type bridge
  ip addr add "$prefix.1/24" dev "$bridge"
  ip link set "$bridge" up
  for node in "${nodes[@]}"; do
    ns=rc$id$node
    ip netns add "$ns"
    ip link add "$ns" type veth peer name eth0 netns "$ns"
    ip link set "$ns" master "$bridge"
    ip link set "$ns" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$prefix.${octet[$node]}/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
  trap - ERR
  names
}

# started PID prints when process PID started (clock ticks after boot), or
# nothing if it is not running.
started() { awk '{print $22}' "/proc/$1/stat" 2>/dev/null || true; }

sweep() {
  need_root
  local f owner since
  for f in "$owners"/*; do
    [ -f "$f" ] || continue
    read -r owner since <"$f" || true
    if [ -n "$owner" ] && [ -n "$since" ] && [ "$(started "$owner")" = "$since" ]; then continue; fi
    id=$(basename "$f")
    [[ "$id" =~ ^[a-z0-9]{1,6}$ ]] || continue
    echo "netns.sh: network $id: its owner (pid $owner) has gone; removing it" >&2
    bridge=rcbr$id
    down
  done
}

link() {
  need_root
  local node=${3:-} state=${4:-}
  [ -n "${octet[$node]:-}" ] || { echo "netns.sh: NODE is one of ${nodes[*]}, got \"$node\"" >&2; exit 2; }
  case "$state" in up | down) ;; *) echo "netns.sh: link ... up|down, got \"$state\"" >&2; exit 2 ;; esac
  ip link set "rc$id$node" "$state"
}

case "$cmd" in
up) up "$@" ;;
sweep) sweep ;;
down) down ;;
link) link "$@" ;;
names) names ;;
*) usage ;;
esac
