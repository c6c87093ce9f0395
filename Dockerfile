# The Actuator controller service: the core install plus the [server] extra. The service never
# imports torch: the project is installed without the [train] extra. Build: docker build -t actuator . (or `docker compose up --build`).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first (pinned by the constraints the test suite was verified with), so a code
# change does not reinstall them.
COPY requirements/constraints.txt requirements/constraints.txt
COPY pyproject.toml README.md ./
COPY actuator actuator
COPY controllers controllers
COPY agents agents
COPY api api
COPY migrations migrations
RUN pip install -c requirements/constraints.txt ".[server]" \
 && useradd --system --uid 10001 --home-dir /app actuator

USER actuator

# Several workers need prometheus_client's multiprocess mode: a directory, emptied on start.
# `actuator serve` closes a connection whose request headers take longer than
# ACTUATOR_HEADER_TIMEOUT seconds (uvicorn itself has no such timeout: slowloris).
ENV ACTUATOR_WORKERS=2 \
    ACTUATOR_HEADER_TIMEOUT=10 \
    PROMETHEUS_MULTIPROC_DIR=/tmp/actuator-metrics

EXPOSE 8000

HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=6 \
  CMD ["python", "-c", "import os, urllib.request as u; t = os.environ.get('ACTUATOR_ADMIN_TOKEN'); u.urlopen(u.Request('http://127.0.0.1:8000/healthz', headers={'Authorization': 'Bearer ' + t} if t else {}), timeout=3)"]

# Migrations are applied by `actuator serve` on start, once, before the workers start.
CMD ["sh", "-c", "mkdir -p \"$PROMETHEUS_MULTIPROC_DIR\" && rm -f \"$PROMETHEUS_MULTIPROC_DIR\"/*.db && exec actuator serve --host 0.0.0.0 --port 8000 --workers \"$ACTUATOR_WORKERS\""]
