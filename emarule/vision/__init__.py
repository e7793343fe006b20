"""Image models, data sets and augmentations shared by the vision tasks (BYOL first).

Everything here imports torch; the CLI reaches it only through `emarule run`/`sweep`.
"""
