#!/bin/sh
# The entrypoint of the test stand-in for the official `memcached` image, on Debian's
# memcached. Arguments that start with an option go to memcached, which runs as the image's
# user `memcache` (uid 11211). The official image's memcached reads its SASL users from the
# file MEMCACHED_SASL_PWDB names (`user:password` lines); Debian's is built against Cyrus SASL's
# own user database instead, so with -S each line of that file becomes a user of a sasldb made
# here, which memcached's SASL configuration names (PLAIN, as the official image offers).
set -eu
case "${1:-memcached}" in -*) set -- memcached "$@" ;; esac
[ $# -gt 0 ] || set -- memcached

if [ "$1" = memcached ] && [ -n "${MEMCACHED_SASL_PWDB:-}" ]; then
  conf="$(mktemp -d)"
  printf 'mech_list: plain\nsasldb_path: %s/sasldb2\n' "$conf" > "$conf/memcached.conf"
  while IFS= read -r line || [ -n "$line" ]; do
    [ -n "$line" ] || continue
    printf '%s' "${line#*:}" | saslpasswd2 -p -c -f "$conf/sasldb2" -a memcached "${line%%:*}"
  done < "$MEMCACHED_SASL_PWDB"
  export SASL_CONF_PATH="$conf"
fi
exec "$@"
