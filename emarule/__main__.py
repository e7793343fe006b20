"""`python -m emarule` is what torchrun launches (`torchrun ... -m emarule run ...`)."""

from emarule.cli.main import main

if __name__ == "__main__":
    main()
