# A stand-in for python:3.11-slim where no registry serves it: Debian's python3 (3.11) on the
# local debootstrap base, with the host's extra CA certificates (TLS-intercepting proxies).
ARG BASE
FROM ${BASE}
ENV LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
COPY certs/ /usr/local/share/ca-certificates/host/
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-pip python3-venv ca-certificates \
 && update-ca-certificates \
 && rm -f /usr/lib/python3*/EXTERNALLY-MANAGED \
 && ln -sf /usr/bin/python3 /usr/local/bin/python \
 && ln -sf /usr/bin/pip3 /usr/local/bin/pip \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
CMD ["python3"]
