#!/usr/bin/env bash
# testenv.sh CMD... — starts what the tests need, runs CMD, stops it all:
# two private MariaDB instances (one per test cell) and a memcached, on free
# ports with data dirs under a temp folder. CMD sees:
#   REDCELL_TEST_MYSQL_DSN_1, REDCELL_TEST_MYSQL_DSN_2   go-sql-driver DSNs
#   REDCELL_TEST_MEMCACHED                              host:port
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/services.sh"
ensure_packages

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
