"""hyperplan: GPU node pools against reserved capacity, on any Kubernetes cluster."""

__version__ = "0.1.0"
