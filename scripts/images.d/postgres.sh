#!/bin/sh
# The entrypoint of the test stand-in for the official `postgres` image, on Debian's
# PostgreSQL. It keeps that image's contract: POSTGRES_PASSWORD (required unless
# POSTGRES_HOST_AUTH_METHOD=trust), POSTGRES_USER (default postgres), POSTGRES_DB (default the
# user), PGDATA (default /var/lib/postgresql/data), port 5432 on every address with
# scram-sha-256 from the network, the server run as `postgres` (uid 999) after the data
# directory is made its own, and a first argument that is an option meaning `postgres`.
set -eu
case "${1:-postgres}" in -*) set -- postgres "$@" ;; esac
[ $# -gt 0 ] || set -- postgres

if [ "$1" = postgres ]; then
  PGDATA="${PGDATA:-/var/lib/postgresql/data}"
  export PGDATA
  if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown -R postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 0700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
  fi
  if [ ! -s "$PGDATA/PG_VERSION" ]; then
    user="${POSTGRES_USER:-postgres}"
    db="${POSTGRES_DB:-$user}"
    auth="${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}"
    if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$auth" != trust ]; then
      echo "Error: Database is uninitialized and superuser password is not specified." >&2
      echo "       Set POSTGRES_PASSWORD (or POSTGRES_HOST_AUTH_METHOD=trust)." >&2
      exit 1
    fi
    pwfile="$(mktemp)"
    printf '%s\n' "${POSTGRES_PASSWORD:-}" > "$pwfile"
    initdb --username="$user" --pwfile="$pwfile" --auth-local=trust --auth-host="$auth" \
      -D "$PGDATA" > /dev/null
    rm -f "$pwfile"
    echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
    echo "host all all all $auth" >> "$PGDATA/pg_hba.conf"
    if [ "$db" != postgres ]; then
      quoted="$(printf '%s' "$db" | sed 's/"/""/g')"
      echo "CREATE DATABASE \"$quoted\" OWNER \"$(printf '%s' "$user" | sed 's/"/""/g')\";" \
        | postgres --single -D "$PGDATA" postgres > /dev/null
    fi
    echo "PostgreSQL init process complete; ready for start up."
  fi
fi
exec "$@"
