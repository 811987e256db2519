# kafka-fetch-proxy: a Kafka sidecar proxy that reshapes Fetch traffic.
#
# Build:  docker build -t kafka-fetch-proxy .
# Run:    docker run -p 127.0.0.1:9092:9092 -p 127.0.0.1:9094:9094 -p 127.0.0.1:9464:9464 \
#           -e KAFKA_FETCH_PROXY_UPSTREAM=broker:9092 -e KAFKA_FETCH_PROXY_ADVERTISED_HOST=localhost \
#           -e KAFKA_FETCH_PROXY_LISTEN=0.0.0.0:9092 -e KAFKA_FETCH_PROXY_METRICS_LISTEN=0.0.0.0:9464 \
#           kafka-fetch-proxy
#     or  docker run -v $PWD/proxy.toml:/etc/kafka-fetch-proxy/proxy.toml:ro ... \
#           kafka-fetch-proxy --config /etc/kafka-fetch-proxy/proxy.toml
#
# Configuration: a TOML file mounted anywhere (pass --config PATH as the command),
# and/or KAFKA_FETCH_PROXY_* environment variables, and/or flags as the command;
# flags > env > file > defaults (see `kafka-fetch-proxy run --help`).
#
# Private by default: every listener binds the container's loopback, reachable only
# from its own network namespace (the application beside it in a Kubernetes pod).
# Environment beats the file, so the image sets in its environment only what the
# file cannot: metrics_listen, which its HEALTHCHECK reads too.  Published ports
# (docker run -p) reach the container's own interface, not its loopback: to publish
# them, set KAFKA_FETCH_PROXY_LISTEN / KAFKA_FETCH_PROXY_METRICS_LISTEN to 0.0.0.0 as
# above (the broker listeners bind the same host as LISTEN) and publish them on the
# host's loopback (-p 127.0.0.1:...), or on an address only your clients reach.
#
# Ports (EXPOSE documents the defaults):
#   9092       bootstrap listener (listen, default 127.0.0.1:9092): clients' bootstrap.servers
#   9093-9099  one listener per upstream broker, port = broker_port_base (9093) + node id,
#              on listen's host; publish the ports of your brokers' node ids, same numbers
#   9464       HTTP: /metrics, /healthz, /readyz (KAFKA_FETCH_PROXY_METRICS_LISTEN,
#              127.0.0.1:9464 in the image)
#
# Decision log (off unless KAFKA_FETCH_PROXY_DECISION_LOG is set): write it under
# /var/log/kafka-fetch-proxy, which belongs to the proxy's user; mount a volume there
# (an emptyDir in Kubernetes, where the root filesystem is read-only), or use - for stdout.

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proxy ./proxy
# the package and its runtime dependencies only (no test or spark extras; no devbroker/,
# the dev cluster of the demo and the tests)
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin kfp \
 && install -d -o 10001 -g 10001 /var/log/kafka-fetch-proxy
COPY --from=build /wheels /wheels
# pyproject.toml also declares kafka-devbroker, whose package the image leaves out
RUN pip install --no-cache-dir --no-index --find-links /wheels kafka-fetch-proxy \
 && rm -f /usr/local/bin/kafka-devbroker \
 && rm -rf /wheels
USER 10001:10001
# No listen or broker_port_base here: a variable would override the mounted file's value.
ENV PYTHONUNBUFFERED=1 \
    KAFKA_FETCH_PROXY_METRICS_LISTEN=127.0.0.1:9464
EXPOSE 9092 9093-9099 9464
# python -m proxy.observe.healthcheck reads KAFKA_FETCH_PROXY_METRICS_LISTEN and GETs /healthz
# (the image has no curl).
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-m", "proxy.observe.healthcheck", "--path", "/healthz"]
ENTRYPOINT ["kafka-fetch-proxy", "run"]
CMD []
