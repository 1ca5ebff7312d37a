# syntax=docker/dockerfile:1
# The gateway as a small non-root image:
#   docker build -t mq-gateway:0.1.0 .
#   docker run --rm -p 4150:4150 -p 4151:4151 -p 11300:11300 -v gateway-data:/var/lib/gateway mq-gateway:0.1.0
# (the tag is the package's version, as deploy/compose.yaml and deploy/kubernetes name it)
# Arguments after the image name are `gateway serve` flags (--log-level debug, --store URL,
# --nats off, ...); flags beat GATEWAY_* variables, which beat the config file.
# tests/deploy/test_image_install.py runs this file's install commands in a fresh venv and
# starts the result with this file's environment and config: keep the RUN, COPY and ENV
# lines plain.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# Stage 1: every wheel the gateway needs. Its dependencies publish manylinux wheels, so no
# compiler is needed here either; if one ever must build from source, it builds in this
# stage and never reaches the final image.
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway ./gateway
RUN python -m pip wheel --no-cache-dir --wheel-dir /wheels .

# Stage 2: a venv installed from those wheels alone (--no-index: nothing else comes in).
FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 gateway \
    && useradd --system --uid 10001 --gid gateway --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin gateway \
    && mkdir -p /var/lib/gateway \
    && chown gateway:gateway /var/lib/gateway
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m venv /opt/gateway \
    && /opt/gateway/bin/pip install --no-cache-dir --no-index --find-links=/wheels mq-gateway

# The image's settings (every listener on all interfaces, the data dir in the volume) are a
# config file, not GATEWAY_* variables: the lowest explicit source, so `docker run IMAGE
# --nats off`, `-e GATEWAY_NATS=off` and a `--config` file of one's own all take effect. A
# --config file replaces this one whole (it names its own listeners and data_dir).
# RocketMQ clients dial the address routes name: set GATEWAY_ROCKETMQ_BROKER__ADVERTISE to
# the pod's or host's reachable IPv4 host:port (unset, routes name 127.0.0.1, with a warning).
COPY config/image.toml /opt/gateway/etc/gateway.toml
ENV PATH=/opt/gateway/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    GATEWAY_CONFIG=/opt/gateway/etc/gateway.toml

# NSQ TCP, HTTP (nsqd/nsqlookupd API, /metrics, /health, /ready, admin page), beanstalkd,
# NATS client, NATS cluster route, RocketMQ nameserver
EXPOSE 4150 4151 4152 11300 4222 6222 9876
# the embedded durable store's files (--data-dir); mount a volume here to keep them
VOLUME ["/var/lib/gateway"]
WORKDIR /var/lib/gateway
USER 10001:10001
# SIGTERM: stop accepting, return in-flight work to the queue, flush the store, exit 0
# (well within 10 s). The gateway runs as PID 1 and handles SIGTERM, SIGINT and SIGUSR1
# (beanstalkd drain mode) itself.
STOPSIGNAL SIGTERM
ENTRYPOINT ["gateway", "serve"]
CMD []
