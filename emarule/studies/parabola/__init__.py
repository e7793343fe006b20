"""The noisy parabola of §3.1 and Appendix F.1: SGD + a Polyak-Ruppert EMA, scaled by κ.

- `problem`: the parabola, its scaled runs and their shared time grid
- `ema`: the EMA of many paths for many momenta at once, and its exact mean in D=1
- `simulate`: Monte Carlo θ paths whose large-batch noise is the mean of the small-batch noise
- `search`: the empirically optimal momentum ρ*: an octave grid in 1 − ρ, then Chebyshev interpolation
- `study`: one (ρ_B, D) configuration → one record per (convention, κ)
- `sweep`: every configuration of a spec, the Monte Carlo ones in worker processes
- `figures`: Fig. 1a/1b in the paper's layout
"""
