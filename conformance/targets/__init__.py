"""The built-in targets (``mlp``, ``tied-lm``, ``branchy``, ``convbn``, ``trainer``): plain target files.

Each module defines the names of the target contract (README, "Writing a target") and imports
nothing of the suite, so it doubles as an example to copy. They are loaded by name through
:func:`conformance.harness.targets.load_target`.
"""
