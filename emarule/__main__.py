"""`python -m emarule` is what torchrun launches (`torchrun ... -m emarule run ...`)."""

from emarule.cli import main

if __name__ == "__main__":
    main()
