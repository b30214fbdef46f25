#!/usr/bin/env bash
# testenv.sh CMD... — starts what the tests need, runs CMD, stops it all:
# two private MariaDB instances (one per test cell) and a memcached, on free
# ports with data dirs under a temp folder; it installs MariaDB, memcached and
# promtool first where missing. CMD sees:
#   REDCELL_TEST_MYSQL_DSN_1, REDCELL_TEST_MYSQL_DSN_2   go-sql-driver DSNs
#   REDCELL_TEST_MEMCACHED                              host:port
# testenv.sh --install only installs what is missing and exits: make test runs
# it once before its two passes start their servers side by side (two apt-get
# at once would fight over dpkg's lock).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/services.sh"
ensure_packages

# ensure_promtool installs promtool if missing: deploy/deploytest runs
# `promtool check rules` and `promtool test rules` on deploy/prometheus and
# fails without it. Debian ships it in the prometheus package, whose install
# would start a Prometheus server: a policy-rc.d answering 101 ("action
# forbidden", read by invoke-rc.d and deb-systemd-invoke) keeps it from
# starting while apt-get runs and is removed afterwards (one already there is
# left alone), and a server started anyway is stopped.
ensure_promtool() {
  command -v promtool >/dev/null 2>&1 && return 0
  echo "installing promtool (package prometheus, without its server) with apt-get ..."
  local SUDO; SUDO=$(need_root_cmd)
  local policy=/usr/sbin/policy-rc.d placed="" rc=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null && $SUDO chmod 755 "$policy" && placed=1
  fi
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq || rc=$?
  if [ "$rc" -eq 0 ]; then
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null || rc=$?
  fi
  if [ -n "$placed" ]; then $SUDO rm -f "$policy"; fi
  if [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now prometheus.service >/dev/null 2>&1 || true
  else
    $SUDO service prometheus stop >/dev/null 2>&1 || true
  fi
  # The package's server if it runs all the same: only a process whose
  # executable is the /usr/bin/prometheus just installed.
  local pid
  for pid in $(pgrep -x prometheus 2>/dev/null || true); do
    if [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = /usr/bin/prometheus ]; then $SUDO kill "$pid" 2>/dev/null || true; fi
  done
  if [ "$rc" -ne 0 ] || ! command -v promtool >/dev/null 2>&1; then
    echo "testenv: promtool could not be installed (apt-get install -y --no-install-recommends prometheus);" >&2
    echo "         the other tests run, deploy/deploytest's TestPrometheusRules fails" >&2
  fi
}
ensure_promtool
if [ "${1:-}" = --install ]; then exit 0; fi

tmp=$(mktemp -d /tmp/redcell-test.XXXXXX)
cleanup() {
  stop_mariadb "$tmp/db1" || true
  stop_mariadb "$tmp/db2" || true
  stop_memcached "$tmp/mc" || true
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

base=$((28000 + RANDOM % 2000)) # below the ephemeral range (32768+), which outgoing connections take from
p1=$(free_port "$base"); p2=$(free_port $((p1 + 1))); pm=$(free_port $((p2 + 1)))
# One tablespace for all tables: the end-to-end test's cells create some
# 6,000 day tables at start, and a file each is slow on a busy machine.
export REDCELL_FILE_PER_TABLE=${REDCELL_FILE_PER_TABLE:-0}
start_mariadb "$tmp/db1" "$p1" fast & j1=$!
start_mariadb "$tmp/db2" "$p2" fast & j2=$!
wait "$j1" && wait "$j2" || { echo "testenv: MariaDB failed to start" >&2; exit 1; }
start_memcached "$tmp/mc" "$pm"

export REDCELL_TEST_MYSQL_DSN_1="root@tcp(127.0.0.1:$p1)/"
export REDCELL_TEST_MYSQL_DSN_2="root@tcp(127.0.0.1:$p2)/"
export REDCELL_TEST_MEMCACHED="127.0.0.1:$pm"
echo "testenv: MariaDB 127.0.0.1:$p1 and :$p2, memcached 127.0.0.1:$pm (under $tmp)"
"$@"
