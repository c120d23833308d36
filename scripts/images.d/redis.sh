#!/bin/sh
# The entrypoint of the test stand-in for the official `redis` image, on Debian's Redis. It
# keeps that image's contract: arguments that start with an option (or name a .conf file) go
# to redis-server; the server runs as `redis` (uid 999) in /data, which is made its own;
# protected mode is off (the image is reached over the network, with --requirepass).
set -eu
case "${1:-redis-server}" in -*|*.conf) set -- redis-server "$@" ;; esac
[ $# -gt 0 ] || set -- redis-server

if [ "$1" = redis-server ]; then
  if [ "$(id -u)" = 0 ]; then
    find . \! -user redis -exec chown redis '{}' +
    exec setpriv --reuid=redis --regid=redis --init-groups "$0" "$@"
  fi
  set -- "$@" --protected-mode no
fi
exec "$@"
