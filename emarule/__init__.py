"""emarule: scale every hyperparameter, the model-EMA momentum included, when the batch size changes.

Reproduces Busbridge et al., "How to Scale Your EMA" (NeurIPS 2023).
"""

__version__ = "0.1.0"
