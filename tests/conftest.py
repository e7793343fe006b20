import os

os.environ.setdefault("WANDB_MODE", "disabled")
