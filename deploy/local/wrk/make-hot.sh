#!/usr/bin/env bash
# make-hot.sh [ROUTER_URL] [KEY_FILE] [OUT]: sends one packet of 5,000,000
# one-cent shares through the router (a deposit of 5,000,000 cents first) and
# writes its ID to OUT, for open-roundrobin.lua to open that packet alone with
# wrk: the hot open. KEY_FILE "-" reads the key from $REDCELL_API_KEY. Real
# money, not stress traffic: use it on a test cluster.
set -euo pipefail
url=${1:-http://127.0.0.1:8080}
if [ "${2:-var/api-key}" = - ]; then key=$REDCELL_API_KEY; else key=$(cat "${2:-var/api-key}"); fi
out=${3:-var/wrk-hot.txt}
s="wrk-hot-$(date +%s%N)"
curl -sf -o /dev/null -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
  -d '{"amount": 5000000, "order_no": "d1"}' "$url/v1/accounts/$s/deposit"
curl -sf -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
  -d "{\"sender\": \"$s\", \"amount\": 5000000, \"count\": 5000000, \"order_no\": \"o1\"}" "$url/v1/packets" |
  grep -o '"packet_id":"[^"]*"' | cut -d'"' -f4 >"$out"
echo "packet $(cat "$out") of 5,000,000 shares in $out"
