#!/usr/bin/env bash
# secrets.sh — the files the Secret redcell-secrets is made of
# (kustomization.yaml, secretGenerator): kubectl apply -k deploy/k8s/ reads them.
#
#   deploy/k8s/secrets.sh                       make what is missing, once
#   deploy/k8s/secrets.sh add-key APP SCOPES    one more API key (then: kubectl apply -k deploy/k8s/)
#
# The first form writes a random cluster secret, admin token, identity key and
# database password under deploy/k8s/secrets/, and a demo API key for the
# routers (its hash in secrets/api-keys.yaml, the key itself in
# secrets/api-key, for your client; the key is not part of the Secret).
# Files that exist are kept, so running it again changes nothing. Keep a copy
# of identity_key: another one gives every phone another act_id. A new
# db_password needs new database volumes: MariaDB sets its root password only
# on an empty data directory.
#
# It runs `redcell apikey` from $REDCELL_BIN, else var/bin/redcell (make build),
# else the redcell:dev image.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir="$here/secrets"
mkdir -p "$dir"
chmod 700 "$dir"

apikey() {
  local bin=${REDCELL_BIN:-}
  if [ -z "$bin" ] && [ -x "$here/../../var/bin/redcell" ]; then bin="$here/../../var/bin/redcell"; fi
  if [ -n "$bin" ]; then
    "$bin" apikey add --keys "$dir/api-keys.yaml" "$@"
  else
    docker run --rm --user "$(id -u):$(id -g)" -v "$dir:/out" redcell:dev \
      apikey add --keys /out/api-keys.yaml "$@"
  fi
}

case "${1:-}" in
  add-key)
    [ $# -eq 3 ] || { echo "usage: $0 add-key APP SCOPES   (scopes: read,deposit,send,open,identity or all)" >&2; exit 2; }
    apikey --app "$2" --scopes "$3" --out "$dir/api-key-$2"
    echo "secrets.sh: the key is in $dir/api-key-$2; now run: kubectl apply -k $here"
    echo "secrets.sh: the routers take it once the kubelet has updated their mounted Secret (a minute or two)"
    exit 0
    ;;
  "") ;;
  *) echo "usage: $0 [add-key APP SCOPES]" >&2; exit 2 ;;
esac

# The files stay readable to you only: kubectl reads them, and the pods get
# their own copies from the Secret (mode 0440, group of the process's user).
for name in cluster_secret admin_token identity_key db_password; do
  if [ ! -s "$dir/$name" ]; then
    (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/$name")
    echo "secrets.sh: wrote $dir/$name"
  fi
done
if [ ! -s "$dir/api-keys.yaml" ]; then
  apikey --app demo --scopes all --out "$dir/api-key"
  echo "secrets.sh: wrote $dir/api-keys.yaml and the demo key in $dir/api-key"
fi
