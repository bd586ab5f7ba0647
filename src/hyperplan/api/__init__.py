"""API models of the hyperplan.dev kinds and the CRDs generated from them."""
