"""`emarule reproduce FAMILY`: every claim of the paper for one family, checked at CPU scale.

    claims.py    the registry: one `Family` per paper section, its claims quoted with their section,
                 the EMA-dependent and the target-model metric (torch-free)
    verdict.py   gaps, the baselines' own spread and the decision rule (torch-free)
    studies.py   the parabola's and the precision study's claims, computed from their results.json
    figures.py   the paper-style figure: every κ overlaid, EMA metric beside the target metric
    report.py    report.md, verdict.json and the printed verdict table
    command.py   runs (or reuses) what a family needs, then measures and writes
"""
