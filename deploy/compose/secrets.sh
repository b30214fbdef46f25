#!/usr/bin/env bash
# secrets.sh — makes the secret files deploy/compose/compose.yaml mounts, once:
# random cluster secret, admin token and database password, and a demo API
# key for the router (its hash in secrets/api-keys.yaml, the key itself in
# secrets/api-key, for your client). Files that exist are kept, so running it
# again changes nothing. It runs `redcell apikey` from $REDCELL_BIN, else
# var/bin/redcell (make build), else the redcell:dev image.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir="$here/secrets"
mkdir -p "$dir"
chmod 700 "$dir"
umask 077
for name in cluster_secret admin_token db_password; do
  if [ ! -s "$dir/$name" ]; then
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/$name"
    echo "secrets.sh: wrote $dir/$name"
  fi
done
if [ ! -s "$dir/api-keys.yaml" ]; then
  bin=${REDCELL_BIN:-}
  [ -n "$bin" ] || { [ -x "$here/../../var/bin/redcell" ] && bin="$here/../../var/bin/redcell"; } || true
  if [ -n "$bin" ]; then
    "$bin" apikey add --keys "$dir/api-keys.yaml" --app demo --scopes all --out "$dir/api-key"
  else
    docker run --rm --user "$(id -u):$(id -g)" -v "$dir:/out" redcell:dev \
      apikey add --keys /out/api-keys.yaml --app demo --scopes all --out /out/api-key
  fi
  echo "secrets.sh: wrote $dir/api-keys.yaml and the demo key in $dir/api-key"
fi
# The containers run as other users (MariaDB's mysql, redcell's nonroot):
# Compose bind-mounts these files, so they must be readable to them.
chmod 644 "$dir"/cluster_secret "$dir"/admin_token "$dir"/db_password "$dir"/api-keys.yaml
chmod 755 "$dir"
