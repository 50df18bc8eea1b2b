# lane-worker: one image per release. The release id is baked in at build time:
#   docker build --build-arg DEEPLINE_RUNTIME_DEPLOY_VERSION=$(git rev-parse HEAD) .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml uv.lock README.md ./
COPY worker ./worker
COPY docker/install.sh ./docker/install.sh
RUN sh docker/install.sh /app/.venv

FROM python:3.11-slim
# The variable worker.lanes reads for this machine's release lane (RELEASE_ID_ENV).
ARG DEEPLINE_RUNTIME_DEPLOY_VERSION
# Without it the image would serve the dev lane (queue `runs`) shared by every such image.
RUN test -n "$(printf %s "$DEEPLINE_RUNTIME_DEPLOY_VERSION" | tr -d '[:space:]')" || { echo "build with --build-arg DEEPLINE_RUNTIME_DEPLOY_VERSION=<release id>, e.g. \$(git rev-parse HEAD)" >&2; exit 1; }
ENV DEEPLINE_RUNTIME_DEPLOY_VERSION=${DEEPLINE_RUNTIME_DEPLOY_VERSION} \
    PATH=/app/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    LANE_WORKER_LOG_FORMAT=json \
    LANE_WORKER_HEALTH_PORT=8080
RUN useradd --system --uid 10001 --no-create-home --home-dir /nonexistent lane
COPY --from=build /app/.venv /app/.venv
USER lane
# /healthz, /readyz and /metrics (must agree with fly.toml's checks and metrics).
EXPOSE 8080
# The daemon drains on SIGTERM (and SIGINT); fly.toml's kill_signal says the same.
STOPSIGNAL SIGTERM
# Replace the demo app with yours: lane-worker run --app your.module:app
CMD ["lane-worker", "run", "--app", "worker.demo:app"]
