"""The parts of the pytest plugin, one concept each, behind its face ``conformance/plugin.py``
(the module pytest loads, which hands their hooks and fixtures on): ``options`` (the command
line and what it resolves to), ``keys`` (what the parts hand each other on a test report or in
``config.stash``), ``terminal`` (the lines a user sees), ``session`` (the suite's session and
world fixtures), ``items`` (one pytest item per check and target, and its status), ``records``
(what a test report and the run's end bring to the report), ``writer`` (the report dir,
controller only) and ``verdict`` (pytest's exit status follows the run's verdict)."""
