"""The chaos checks (entries named in conformance/registry.py): ``run(ctx) -> Outcome`` each."""

__all__: list[str] = []
