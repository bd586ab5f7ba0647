#!/bin/bash
# podnet: hyperplan's small CNI for kind clusters built without kindnetd (docs/kind.md).
#
# One pod per node (a hostNetwork DaemonSet). Every few seconds it
#  - writes /etc/cni/net.d/10-podnet.conflist: a Linux bridge with host-local addresses from
#    this node's spec.podCIDR (the CNI plugins come from Debian's containernetworking-plugins);
#  - routes every other node's podCIDR via that node's InternalIP (all kind nodes share one
#    docker network, so one hop reaches them);
#  - masquerades traffic from this node's pods to addresses outside the cluster's pod subnet.
# Inputs: NODE_NAME (downward API), POD_SUBNET, CNI_CONF_DIR (a hostPath), INTERVAL seconds.
set -u
: "${NODE_NAME:?NODE_NAME must be set}"
POD_SUBNET="${POD_SUBNET:-10.244.0.0/16}"
CNI_CONF_DIR="${CNI_CONF_DIR:-/etc/cni/net.d}"
INTERVAL="${INTERVAL:-5}"
CONF="$CNI_CONF_DIR/10-podnet.conflist"

log() { echo "$(date -u +%H:%M:%S) podnet[$NODE_NAME]: $*"; }

write_conflist() {
  local cidr="$1" tmp
  tmp="$(mktemp "$CNI_CONF_DIR/.podnet.XXXXXX")"
  cat > "$tmp" <<JSON
{
  "cniVersion": "0.4.0",
  "name": "podnet",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "podnet0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$cidr"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
  if cmp -s "$tmp" "$CONF"; then
    rm -f "$tmp"
  else
    chmod 0644 "$tmp" && mv -f "$tmp" "$CONF"
    log "wrote $CONF for $cidr"
  fi
}

ensure_masquerade() {
  local cidr="$1"
  iptables -t nat -C POSTROUTING -s "$cidr" ! -d "$POD_SUBNET" -m comment --comment podnet \
    -j MASQUERADE 2> /dev/null \
    || { iptables -t nat -A POSTROUTING -s "$cidr" ! -d "$POD_SUBNET" -m comment --comment podnet \
           -j MASQUERADE && log "masquerading $cidr to outside $POD_SUBNET"; }
}

declare -A routed=()
while true; do
  nodes="$(kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.spec.podCIDR}{" "}{.status.addresses[?(@.type=="InternalIP")].address}{"\n"}{end}' 2>&1)" \
    || { log "cannot list nodes: $nodes"; sleep "$INTERVAL"; continue; }
  while read -r name cidr ip; do
    [ -n "$name" ] && [ -n "$cidr" ] || continue
    if [ "$name" = "$NODE_NAME" ]; then
      write_conflist "$cidr"
      ensure_masquerade "$cidr"
    elif [ -n "$ip" ] && [ "${routed[$cidr]:-}" != "$ip" ]; then
      if ip route replace "$cidr" via "$ip"; then
        routed[$cidr]="$ip"
        log "route $cidr via $ip ($name)"
      fi
    fi
  done <<< "$nodes"
  sleep "$INTERVAL"
done
