"""The distribution's own namespace for the suite's generic folder names.

The top-level folders ``faults/`` and ``reports/`` (the design card's layout) install and import
as ``ddp_conformance.faults`` and ``ddp_conformance.reports``, mapped by the packaging
(``[tool.setuptools] package-dir`` in pyproject.toml, for a wheel and an editable install
alike), so that a user's own ``faults`` or ``reports`` package can neither shadow the suite's nor
be shadowed by it. Nothing imports the bare names ``faults``/``reports``;
``tests/test_architecture.py`` and ``tests/test_packaging.py`` hold that.
"""
