"""The suite as pytest collects it: one test item per (check id, target).

    pytest --pyargs conformance.suite --ddp-report-dir out/
"""
