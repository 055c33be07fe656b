"""The conformance checks: one module per check id (see conformance.harness.registry)."""
