"""Side effects: Kubernetes calls, the capacity ledger, node providers. Each behind a Protocol with a recording fake."""
