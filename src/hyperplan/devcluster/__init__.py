"""The local control plane: real Kubernetes binaries built from their Go modules, run on loopback."""
