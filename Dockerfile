# syntax=docker/dockerfile:1
# One image for every role of Fenced Exports, chosen by the command:
#   python worker.py                                  the Temporal worker (the default)
#   python starter.py serve --host 0.0.0.0 --port 8080  the HTTP API and console
#   python starter.py migrate                         the one-shot migration (run it first)
#   python starter.py pause --global --reason ...     the platform's global switch, as a login granted
#                                                     exports_platform and exports_api (exports_platform_ops)
# Configured entirely by EXPORTS_* environment variables (settings.py). The health check reads
# EXPORTS_HEALTH_URL: the worker's /healthz on its metrics port (EXPORTS_METRICS_PORT, 9464) by default;
# the API sets it to its own /healthz (deploy/compose.yaml does).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# -- build: the dependencies into a virtual environment, from binary wheels only (nothing is compiled) --
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > requirements.txt \
    && python -m venv /opt/venv \
    && /opt/venv/bin/pip install --only-binary=:all: -r requirements.txt

# -- runtime: the environment and the application, run as an unprivileged user ----------------------------
FROM ${PYTHON_IMAGE} AS runtime
# gnupg: the builder encrypts and signs OpenPGP files with Debian's gpg in its own process (encoding/); it is
# the one system package the application runs, and the lists go with the layer.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gnupg \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 exports \
    && useradd --system --uid 10001 --gid exports --home-dir /app --no-create-home --shell /usr/sbin/nologin exports \
    && install -d -o exports -g exports -m 0700 /var/lib/fenced-exports
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY settings.py worker.py starter.py ./
COPY domain/ domain/
COPY encoding/ encoding/
COPY rules/ rules/
COPY db/ db/
COPY partner/ partner/
COPY workflows/ workflows/
COPY activities/ activities/
COPY runtime/ runtime/
COPY service/ service/
COPY api/ api/
COPY observability/ observability/
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    EXPORTS_WORK_DIR=/var/lib/fenced-exports \
    EXPORTS_HEALTH_URL=http://127.0.0.1:9464/healthz
USER exports
EXPOSE 8080 9464
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['EXPORTS_HEALTH_URL'], timeout=4)"]
CMD ["python", "worker.py"]
