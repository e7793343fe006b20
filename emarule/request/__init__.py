"""What a command asks for, before anything runs: the spec and κ resolved to a plan (`resolve`), every option and
path checked (`checks`), seeds parsed (`seeds`), the command that shows or reruns a run (`suggest`). Torch-free;
the command line (`emarule.cli`) and the drivers in `emarule.analysis` both use it."""
