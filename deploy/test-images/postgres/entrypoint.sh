#!/bin/sh
# As postgres:16 does on an empty data directory: initdb with POSTGRES_USER as superuser and
# POSTGRES_PASSWORD (scram-sha-256 over the network), create POSTGRES_DB, then serve on every
# interface with the socket where pg_isready looks (/var/run/postgresql).
set -eu
if [ "${1:-}" = postgres ]; then
  shift
  user="${POSTGRES_USER:-postgres}"
  db="${POSTGRES_DB:-$user}"
  if [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set}"
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" --auth-local=trust \
      --auth-host=scram-sha-256 >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -c unix_socket_directories=/tmp" -w start >/dev/null
    if [ "$db" != postgres ]; then
      psql -v ON_ERROR_STOP=1 -h /tmp -U "$user" -d postgres -c "CREATE DATABASE \"$db\"" >/dev/null
    fi
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  fi
  exec postgres -D "$PGDATA" -c listen_addresses='*' \
    -c unix_socket_directories=/var/run/postgresql "$@"
fi
exec "$@"
