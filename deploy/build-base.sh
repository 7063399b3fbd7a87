#!/usr/bin/env bash
# Builds selectivity-base:bookworm, a stand-in for python:3.11-slim where no image registry is
# reachable (CI): Debian bookworm by debootstrap (minbase) with Debian's python3.11, its venv
# module and CA certificates (and this machine's trusted CAs), imported with `docker import`. The Dockerfile takes it as
# `--build-arg BASE=selectivity-base:bookworm`; the test-only Redis and PostgreSQL images
# (deploy/test-images/) build on it too. Cached: does nothing if the image exists.
# Usage: deploy/build-base.sh [IMAGE]   (default selectivity-base:bookworm)
set -euo pipefail
image="${1:-selectivity-base:bookworm}"
if docker image inspect "$image" >/dev/null 2>&1; then
  echo "$image exists"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "debootstrap is not installed" >&2; exit 1; }
# The Debian mirror this machine's apt uses (deb822 or one-line sources), else Debian's CDN.
mirror=""
for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
  [ -r "$f" ] || continue
  mirror=$(awk '
    /^URIs:/ && $2 ~ /\/debian\/?$/ { print $2; exit }
    /^deb / { for (i = 2; i <= NF; i++) if ($i ~ /^https?:.*\/debian\/?$/) { print $i; exit } }
  ' "$f")
  [ -n "$mirror" ] && break
done
mirror="${mirror:-http://deb.debian.org/debian}"
root=$(mktemp -d /tmp/selectivity-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  bookworm "$root" "$mirror" >/tmp/selectivity-base-debootstrap.log 2>&1 \
  || { tail -n 30 /tmp/selectivity-base-debootstrap.log >&2; exit 1; }
cat >"$root/etc/apt/sources.list" <<SOURCES
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb ${mirror%/debian*}/debian-security bookworm-security main
SOURCES
# TLS as on this machine: the builder's pip reaches PyPI through the host's trusted CAs (kept
# through any later update-ca-certificates by the copy under /usr/local/share).
if [ -r /etc/ssl/certs/ca-certificates.crt ]; then
  cp /etc/ssl/certs/ca-certificates.crt "$root/usr/local/share/ca-certificates/host-bundle.crt"
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
fi
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/* "$root"/tmp/*
tar -C "$root" --numeric-owner -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["bash"]' \
  - "$image" >/dev/null
echo "$image built ($(docker image inspect -f '{{.Size}}' "$image") bytes)"
