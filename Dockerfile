# The hyperplan operator image. Build and load it into kind:
#   docker build -t hyperplan:0.1.0 .
#   kind load docker-image hyperplan:0.1.0 --name hyperplan
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Only what `pip install .` needs: the project metadata (which names README.md) and the sources.
WORKDIR /build
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install . && rm -rf /build

# The uid/gid match the chart's podSecurityContext (runAsUser/runAsGroup 10001).
RUN groupadd --system --gid 10001 hyperplan \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin hyperplan
USER 10001:10001
WORKDIR /

# 8000: Prometheus metrics (/metrics); 8081: liveness (/healthz).
EXPOSE 8000 8081
ENTRYPOINT ["hyperplan", "run"]
