"""The `emarule` command line: `main` (the Typer app), `render` (text output), `timm_plan`. Nothing in the library
imports it: what a command checks before anything is written is `emarule.request`."""
