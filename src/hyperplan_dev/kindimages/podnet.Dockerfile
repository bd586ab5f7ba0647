# hyperplan-local/podnet: the small CNI daemon of podnet.sh (see docs/kind.md).
ARG BASE
FROM ${BASE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends iproute2 iptables \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
COPY kubectl /usr/local/bin/kubectl
COPY podnet.sh /usr/local/bin/podnet
RUN chmod 0755 /usr/local/bin/podnet /usr/local/bin/kubectl
ENTRYPOINT ["/usr/local/bin/podnet"]
