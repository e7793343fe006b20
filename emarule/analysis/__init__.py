"""Reading finished runs: `compare`, `run_report`, the tracking `probe` and `reproduce` (every claim, checked)."""
