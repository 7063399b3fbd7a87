FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN apt-get update && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 selectivity
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY service ./service
COPY workers ./workers
COPY migrations ./migrations
COPY bench ./bench
RUN pip install . \
    && install -d -m 0700 -o selectivity -g selectivity /data /coldstore
USER selectivity
ENV SELECTIVITY_DATA_DIR=/data
EXPOSE 8000
CMD ["selectivity", "serve", "--host", "0.0.0.0", "--port", "8000", "--no-migrate"]
