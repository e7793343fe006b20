"""The paper's studies that are not a training loop: the noisy parabola (§3.1) and the precision study."""
