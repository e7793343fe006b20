"""The `emarule` command line: `main` (the Typer app), `render` (text output), `checks` (before anything is written)."""
