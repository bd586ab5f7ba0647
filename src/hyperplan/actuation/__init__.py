"""Side effects: Kubernetes calls, the capacity ledger, node providers. Each behind a Protocol;
the recording fakes that tests use in their place are in :mod:`hyperplan_testing.fakes`."""
