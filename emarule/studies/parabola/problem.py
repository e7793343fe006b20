"""The noisy parabola L(θ) = a‖θ‖²/2 and its scaled runs.

Gradient noise. The paper writes g = aθ + ε with ε ~ N(0, (b g² + c)/κ), which defines g
through itself. We read g² in the variance as the squared *noise-free* gradient (aθ)²,
per coordinate: ε_i ~ N(0, (b (aθ_i)² + c)/κ). This is the usual multiplicative-plus-additive
noise model, and it keeps E[g | θ] = aθ, so E θ_k = (1 − ηa)^k θ_0 exactly.

Scaling. At κ the learning rate is κη_B, the run has ⌊I_B/κ⌋ steps and the noise variance is
divided by κ (a κ times larger batch). Scaled step j and base step jκ have seen the same
number of samples; time is t = jκη_B in units of T = I_B η_B, the shared grid on which
trajectories are compared.

θ_0 has norm `theta0` in every dimension (each coordinate theta0/√D), so the curves of
different D start at the same point and their errors are comparable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from emarule.errors import UserError
from emarule.scaling.rules import lr_linear


@dataclass(frozen=True)
class Problem:
    a: float = 1.0
    b: float = 0.5
    c: float = 0.0
    theta0: float = 1.0
    lr: float = 1e-4  # η_B
    iters: int = 10_000  # I_B

    @property
    def horizon(self) -> float:
        return self.iters * self.lr

    def check_kappa(self, kappa) -> int:
        k = float(kappa)
        if not (k >= 1 and k.is_integer()):
            raise UserError(f"parabola.kappas: κ must be a whole number ≥ 1 so that scaled step j meets "
                            f"base step jκ on the shared time grid, got {kappa!r}")
        k = int(k)
        if k > self.iters:
            raise UserError(f"parabola.kappas: κ={k} leaves no step of the {self.iters} base iterations")
        if lr_linear(self.lr, k) * self.a >= 1.0:
            raise UserError(f"parabola.kappas: κ={k} gives ηa = {lr_linear(self.lr, k) * self.a:g} ≥ 1, "
                            f"where SGD on the parabola overshoots; lower κ or optimizer.lr")
        return k

    def scaled(self, kappa: int) -> "Scaled":
        k = self.check_kappa(kappa)
        # ⌊I_B/κ⌋ rather than rules.steps' rounding: the scaled run must not outlast the base run.
        return Scaled(self, k, lr_linear(self.lr, k), self.iters // k)


@dataclass(frozen=True)
class Scaled:
    problem: Problem
    kappa: int
    lr: float  # η = κη_B
    n: int  # steps

    @property
    def q(self) -> float:
        """E θ_{k+1} = q E θ_k."""
        return 1.0 - self.lr * self.problem.a

    @property
    def noise_sd(self) -> float:
        """ε = √((b(aθ)² + c)/κ)·z; with c = 0 the step multiplies θ by 1 − η a (1 + noise_sd·z)."""
        return math.sqrt(self.problem.b / self.kappa)

    def times(self) -> np.ndarray:
        """t_j = jκη_B for j = 0..n: samples seen / base batch × η_B."""
        return np.arange(self.n + 1) * (self.kappa * self.problem.lr)

    def base_index(self) -> np.ndarray:
        """The base-run steps on the shared grid (jκ)."""
        return np.arange(self.n + 1) * self.kappa

    def mean_theta(self, dim: int = 1) -> np.ndarray:
        """E θ_j per coordinate: the noise has zero mean and the update is linear in θ."""
        return (self.problem.theta0 / math.sqrt(dim)) * self.q ** np.arange(self.n + 1)
