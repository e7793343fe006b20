"""The experiment spec: `load` (YAML, presets, --set) and `schema` (the keys each task reads). Torch-free."""
