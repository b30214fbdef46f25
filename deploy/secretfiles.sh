#!/usr/bin/env bash
# secretfiles.sh — what deploy/compose/secrets.sh and deploy/k8s/secrets.sh
# share. Sourced by them once they have set here (the script's folder): it
# sets dir, the folder of the secret files, $here/secrets, and makes it
# (mode 700).

dir="$here/secrets"
mkdir -p "$dir"
chmod 700 "$dir"

# apikey_add ARGS... runs `redcell apikey add --keys $dir/api-keys.yaml ARGS...`
# from $REDCELL_BIN, else var/bin/redcell (make build), else the redcell:dev
# image.
apikey_add() {
  local bin=${REDCELL_BIN:-}
  if [ -z "$bin" ] && [ -x "$here/../../var/bin/redcell" ]; then bin="$here/../../var/bin/redcell"; fi
  if [ -n "$bin" ]; then
    "$bin" apikey add --keys "$dir/api-keys.yaml" "$@"
  else
    docker run --rm --user "$(id -u):$(id -g)" -v "$dir:/out" redcell:dev \
      apikey add --keys /out/api-keys.yaml "$@"
  fi
}

# write_secrets MODE NAME... writes each secret file $dir/NAME that is missing
# or empty: 32 random bytes in hex, made with umask 077, then given MODE
# ("" keeps it 0600). A file that exists is kept.
write_secrets() {
  local mode=$1 name
  shift
  for name in "$@"; do
    if [ ! -s "$dir/$name" ]; then
      (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/$name")
      if [ -n "$mode" ]; then chmod "$mode" "$dir/$name"; fi
      echo "secrets.sh: wrote $dir/$name"
    fi
  done
}
