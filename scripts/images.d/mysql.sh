#!/bin/sh
# The entrypoint of the test stand-in for the official `mysql` image, on Debian's MariaDB. It
# keeps that image's contract: MYSQL_ROOT_PASSWORD (or MYSQL_ALLOW_EMPTY_PASSWORD), and
# optionally MYSQL_DATABASE, MYSQL_USER and MYSQL_PASSWORD (the user gets every privilege on
# the database); data in /var/lib/mysql; port 3306 on every address; root may log in from
# anywhere with its password; the server run as `mysql` (uid 999); a first argument that is an
# option meaning `mysqld`. The first start initializes the data directory through a server
# that listens on a socket only, as the official image does, so the port answers only once the
# users exist.
set -eu
case "${1:-mysqld}" in -*) set -- mysqld "$@" ;; esac
[ $# -gt 0 ] || set -- mysqld

# A string or a name for SQL: quotes and backslashes escaped.
lit() { printf "'%s'" "$(printf '%s' "$1" | sed "s/\\\\/\\\\\\\\/g; s/'/\\\\'/g")"; }
ident() { printf '`%s`' "$(printf '%s' "$1" | sed 's/`/``/g')"; }

if [ "$1" = mysqld ] || [ "$1" = mariadbd ]; then
  shift
  set -- mariadbd --bind-address=0.0.0.0 --skip-name-resolve "$@"
  datadir=/var/lib/mysql
  if [ "$(id -u)" = 0 ]; then
    mkdir -p "$datadir" /run/mysqld
    chown -R mysql:mysql "$datadir" /run/mysqld
    exec setpriv --reuid=mysql --regid=mysql --init-groups "$0" "$@"
  fi
  if [ ! -d "$datadir/mysql" ]; then
    if [ -z "${MYSQL_ROOT_PASSWORD:-}" ] && [ -z "${MYSQL_ALLOW_EMPTY_PASSWORD:-}" ]; then
      echo "error: database is uninitialized and password option is not specified" >&2
      echo "  You need to specify MYSQL_ROOT_PASSWORD or MYSQL_ALLOW_EMPTY_PASSWORD" >&2
      exit 1
    fi
    mariadb-install-db --datadir="$datadir" --auth-root-authentication-method=normal \
      --skip-test-db --skip-name-resolve > /dev/null
    socket=/run/mysqld/init.sock
    mariadbd --skip-networking --socket="$socket" --datadir="$datadir" &
    pid=$!
    for _ in $(seq 60); do
      mariadb-admin --socket="$socket" -uroot ping > /dev/null 2>&1 && break
      sleep 1
    done
    root="$(lit "${MYSQL_ROOT_PASSWORD:-}")"
    {
      echo "DROP USER IF EXISTS ''@'localhost';"
      echo "ALTER USER 'root'@'localhost' IDENTIFIED BY $root;"
      echo "CREATE USER 'root'@'%' IDENTIFIED BY $root;"
      echo "GRANT ALL ON *.* TO 'root'@'%' WITH GRANT OPTION;"
      if [ -n "${MYSQL_DATABASE:-}" ]; then
        echo "CREATE DATABASE IF NOT EXISTS $(ident "$MYSQL_DATABASE");"
      fi
      if [ -n "${MYSQL_USER:-}" ] && [ -n "${MYSQL_PASSWORD:-}" ]; then
        echo "CREATE USER $(lit "$MYSQL_USER")@'%' IDENTIFIED BY $(lit "$MYSQL_PASSWORD");"
        if [ -n "${MYSQL_DATABASE:-}" ]; then
          echo "GRANT ALL ON $(ident "$MYSQL_DATABASE").* TO $(lit "$MYSQL_USER")@'%';"
        fi
      fi
      echo "FLUSH PRIVILEGES;"
    } | mariadb --socket="$socket" -uroot
    kill "$pid"
    wait "$pid" || true
    echo "MySQL init process done. Ready for start up."
  fi
fi
exec "$@"
