# hyperplan-local/kind-node: what kind expects of a node image (kind's images/base and
# pkg/build/nodeimage, read from its Go module), made from Debian packages: systemd as init,
# Debian's containerd/runc/CNI plugins, kind's entrypoint and base files, kubelet/kubeadm/kubectl.
# The build context is prepared by hyperplan_dev.images.node_image.
ARG BASE
FROM ${BASE}
ARG KUBERNETES_VERSION
ARG PAUSE_IMAGE
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      systemd conntrack iptables nftables iproute2 ethtool util-linux mount kmod libseccomp2 \
      pigz e2fsprogs bash ca-certificates curl jq procps \
      containerd runc containernetworking-plugins \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
COPY files/ /
RUN chmod 755 /kind /kind/bin \
 && find /lib/systemd/system/sysinit.target.wants/ -name "systemd-tmpfiles-setup.service" -delete \
 && rm -f /lib/systemd/system/multi-user.target.wants/* \
 && rm -f /etc/systemd/system/*.wants/* \
 && rm -f /lib/systemd/system/local-fs.target.wants/* \
 && rm -f /lib/systemd/system/sockets.target.wants/*udev* \
 && rm -f /lib/systemd/system/sockets.target.wants/*initctl* \
 && rm -f /lib/systemd/system/basic.target.wants/* \
 && echo "ReadKMsg=no" >> /etc/systemd/journald.conf \
 && ln -sf /usr/lib/systemd/systemd /sbin/init \
 && ln -sf /usr/bin/containerd /usr/local/bin/containerd \
 && systemctl enable kubelet.service containerd.service undo-mount-hacks.service \
 && systemctl mask systemd-binfmt.service \
 && mkdir -p /etc/kubernetes/manifests /opt/cni/bin \
 && for p in /usr/lib/cni/*; do ln -sf "$p" /opt/cni/bin/; done \
 && ctr oci spec \
      | jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
      | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json \
 && sed -i -e 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' \
      -e "s|sandbox_image = .*|sandbox_image = \"${PAUSE_IMAGE}\"|" /etc/containerd/config.toml \
 && grep -q 'restrict_oom_score_adj = true' /etc/containerd/config.toml \
 && echo "${KUBERNETES_VERSION}" > /kind/version
COPY bin/kubelet bin/kubeadm bin/kubectl /usr/bin/
COPY bin/crictl /usr/local/bin/
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]
