# The hyperplan operator image.
#   docker build -t hyperplan:0.1.0 .
#   kind load docker-image hyperplan:0.1.0 --name hyperplan
#
# Build arguments:
#   BASE_IMAGE  the Python 3.11 base of both stages (default python:3.11-slim); machines without a
#               registry pass a local stand-in (`hyperplan dev kind up` builds one, docs/kind.md).
#               Give it by digest to build on exactly the base you checked, e.g.
#               --build-arg BASE_IMAGE=python:3.11-slim@sha256:<digest> (docs/security.md).
# Extra CA certificates (a TLS-intercepting proxy): put PEM files named *.crt into certs/; the
# builder stage trusts them while it downloads packages (certs/README.md). This works with the
# classic builder (Docker 20.10) and with BuildKit alike.
#
# Dependencies are pinned by requirements.lock (`make lock` regenerates it from the venv), each with
# the sha256 of the wheels it may be: pip installs them in hash-checking mode, wheels only.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt
COPY certs/ /usr/local/share/ca-certificates/extra/
RUN if ls /usr/local/share/ca-certificates/extra/*.crt > /dev/null 2>&1; then update-ca-certificates; fi \
 && python -m venv /opt/hyperplan
WORKDIR /src
# The pinned dependencies first: this layer is rebuilt only when the lock changes. A file whose
# sha256 is not in the lock is refused, and no source distribution is built.
COPY requirements.lock ./
RUN /opt/hyperplan/bin/pip install --no-deps --require-hashes --only-binary=:all: -r requirements.lock
# Then the project itself, as a wheel (not the source tree), without touching the pins: it has no
# hash to check in advance, it is built here from the sources copied in.
COPY pyproject.toml README.md ./
COPY src ./src
RUN /opt/hyperplan/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/hyperplan/bin/pip install --no-deps /wheels/hyperplan-*.whl \
 && /opt/hyperplan/bin/pip check \
 && /opt/hyperplan/bin/python -m pip uninstall -y -q pip setuptools wheel

FROM ${BASE_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/hyperplan/bin:${PATH}
# Only the virtual environment: the operator and its pinned dependencies, no sources, no pip.
COPY --from=builder /opt/hyperplan /opt/hyperplan
# The uid/gid match the chart's podSecurityContext (runAsUser/runAsGroup 10001).
RUN groupadd --system --gid 10001 hyperplan \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin hyperplan
USER 10001:10001
WORKDIR /

# 8000: Prometheus metrics (/metrics); 8081: liveness (/healthz).
EXPOSE 8000 8081
ENTRYPOINT ["hyperplan", "run"]
