"""The training engine: the task interface, the loop and what it needs. Importing the package imports no torch."""
