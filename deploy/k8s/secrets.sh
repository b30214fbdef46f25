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
. "$here/../secretfiles.sh" # dir: $here/secrets, made 700

case "${1:-}" in
  add-key)
    [ $# -eq 3 ] || { echo "usage: $0 add-key APP SCOPES   (scopes: read,deposit,send,open,identity or all)" >&2; exit 2; }
    apikey_add --app "$2" --scopes "$3" --out "$dir/api-key-$2"
    echo "secrets.sh: the key is in $dir/api-key-$2; now run: kubectl apply -k $here"
    echo "secrets.sh: the routers take it once the kubelet has updated their mounted Secret (a minute or two)"
    exit 0
    ;;
  "") ;;
  *) echo "usage: $0 [add-key APP SCOPES]" >&2; exit 2 ;;
esac

# The files stay readable to you only: kubectl reads them, and the pods get
# their own copies from the Secret (mode 0440, group of the process's user).
write_secrets "" cluster_secret admin_token identity_key db_password
if [ ! -s "$dir/api-keys.yaml" ]; then
  apikey_add --app demo --scopes all --out "$dir/api-key"
  echo "secrets.sh: wrote $dir/api-keys.yaml and the demo key in $dir/api-key"
fi
