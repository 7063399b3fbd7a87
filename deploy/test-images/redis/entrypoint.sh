#!/bin/sh
# As redis:7 does: `redis-server ARGS` listens on every interface without protected mode (the
# compose network is the boundary), writing to the working directory /data.
set -eu
if [ "${1:-}" = redis-server ]; then
  shift
  exec redis-server --protected-mode no "$@"
fi
exec "$@"
