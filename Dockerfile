# The service's image. The published image builds on python:3.11-slim; CI, where no image
# registry is reachable, builds the same file on a Debian bookworm made by debootstrap
# (deploy/build-base.sh: `--build-arg BASE=selectivity-base:bookworm`). Both are Debian with a
# `python3` 3.11; the builder makes a venv at /opt/venv from it and the runtime stage, on the same
# base, takes only that venv: no compiler, no pip, a non-root user, a HEALTHCHECK on /readyz.
ARG BASE=python:3.11-slim

FROM ${BASE} AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/venv
WORKDIR /src
# The dependencies first, in a layer that a change to the code leaves cached.
COPY pyproject.toml ./
RUN python3 -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'], sep='\n')" > /tmp/requirements.txt \
    && /opt/venv/bin/pip install -r /tmp/requirements.txt
COPY README.md alembic.ini ./
COPY service ./service
COPY workers ./workers
COPY migrations ./migrations
COPY bench ./bench
RUN /opt/venv/bin/pip install --no-deps . \
    && /opt/venv/bin/pip uninstall -y pip setuptools wheel

FROM ${BASE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/venv/bin:$PATH
# libgomp1: LightGBM's OpenMP. The base's own pip (python:3.11-slim has one) goes too.
RUN apt-get update && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
    && if python3 -m pip --version >/dev/null 2>&1; then \
         python3 -m pip uninstall -y pip setuptools wheel; fi \
    && useradd --create-home --uid 10001 selectivity \
    && install -d -m 0700 -o selectivity -g selectivity /data /coldstore
COPY --from=builder /opt/venv /opt/venv
WORKDIR /home/selectivity
USER selectivity
ENV SELECTIVITY_DATA_DIR=/data
EXPOSE 8000
# The API's readiness; compose turns it off for migrate and the workers, which serve no HTTP.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["/opt/venv/bin/python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=4)"]
CMD ["selectivity", "serve", "--host", "0.0.0.0", "--port", "8000", "--no-migrate"]
