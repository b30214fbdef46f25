#!/usr/bin/env bash
# make-packets.sh [ROUTER_URL] [KEY_FILE] [OUT]: sends 2,000 packets (200 senders,
# 10 packets each of 100,000 cents in 1,000 shares) through the router of the
# make run cluster and writes their IDs, one per line, to OUT; open-roundrobin.lua
# then opens them round robin with wrk, as an outside client would (the
# cross-check of `redcell bench --workload roundrobin`). Real money, not stress
# traffic: use it on a test cluster. KEY_FILE "-" reads the key from $REDCELL_API_KEY.
set -euo pipefail
url=${1:-http://127.0.0.1:8080}
if [ "${2:-var/api-key}" = - ]; then key=$REDCELL_API_KEY; else key=$(cat "${2:-var/api-key}"); fi
out=${3:-var/wrk-packets.txt}
: >"$out"
run=$(date +%s)
for i in $(seq 1 200); do
  s="wrk-$run-$i"
  curl -sf -o /dev/null -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
    -d "{\"amount\": 1000000, \"order_no\": \"d$i\"}" "$url/v1/accounts/$s/deposit"
  for j in $(seq 1 10); do
    curl -sf -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
      -d "{\"sender\": \"$s\", \"amount\": 100000, \"count\": 1000, \"order_no\": \"o$j\"}" "$url/v1/packets" |
      grep -o '"packet_id":"[^"]*"' | cut -d'"' -f4 >"$out.$j" &
  done
  wait
  cat "$out".* >>"$out" && rm -f "$out".*
done
echo "$(wc -l <"$out") packet IDs in $out"
