#!/usr/bin/env bash
# secrets.sh — the secret files deploy/compose/compose.yaml mounts.
#
#   deploy/compose/secrets.sh                       make what is missing, once
#   deploy/compose/secrets.sh add-key APP SCOPES    one more API key (then: docker compose restart router)
#
# The first form writes a random cluster secret, admin token and database
# password, and a demo API key for the router (its hash in
# secrets/api-keys.yaml, the key itself in secrets/api-key, for your client).
# Files that exist are kept, so running it again changes nothing; a new
# db_password needs the MariaDB volumes made again (docker compose down -v):
# MariaDB sets its root password only on an empty data directory.
#
# It runs `redcell apikey` from $REDCELL_BIN, else var/bin/redcell (make build),
# else the redcell:dev image.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../secretfiles.sh" # dir: $here/secrets, made 700

apikey() {
  apikey_add "$@"
  # Compose bind-mounts a secret file as it is, and the router runs as
  # another user (nonroot): the hashes must be readable to it.
  chmod 644 "$dir/api-keys.yaml"
}

case "${1:-}" in
  add-key)
    [ $# -eq 3 ] || { echo "usage: $0 add-key APP SCOPES   (scopes: read,deposit,send,open,identity or all)" >&2; exit 2; }
    apikey --app "$2" --scopes "$3" --out "$dir/api-key-$2"
    echo "secrets.sh: the key is in $dir/api-key-$2; restart the router: docker compose -f $here/compose.yaml restart router"
    exit 0
    ;;
  "") ;;
  *) echo "usage: $0 [add-key APP SCOPES]" >&2; exit 2 ;;
esac

# Readable to the containers' users (MariaDB's mysql, redcell's nonroot):
# Compose bind-mounts the files as they are. The directory stays 700.
write_secrets 644 cluster_secret admin_token db_password
if [ ! -s "$dir/api-keys.yaml" ]; then
  apikey --app demo --scopes all --out "$dir/api-key"
  echo "secrets.sh: wrote $dir/api-keys.yaml and the demo key in $dir/api-key"
fi
