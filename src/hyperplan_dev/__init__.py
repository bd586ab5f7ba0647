"""The checkout's development tools, apart from the operator: the local control plane (real
Kubernetes binaries built from their Go modules, run on loopback), the kind cluster and its
images, the machine set-up they need, ``make lock``, and ``make demo`` with its picture.

It sits beside :mod:`hyperplan` in ``src/`` but is not part of the ``hyperplan`` distribution
(pyproject's package discovery leaves it out), so neither the wheel nor the operator's image holds
it; the editable install of the checkout (``pip install -e .``) makes it importable, and
``hyperplan dev ...`` imports it from there.
"""
