"""The optimizer a spec names, and writing a plan's scaled values into its param groups.

Up to three param groups: "decay", "no_decay" (a task's biases and norm parameters when
`optimizer.weight_decay_skip_bias`) and "aux" (a tracking probe: its own lr ratio, no decay).
LARS and LAMB skip their trust ratio for "no_decay" and "aux", as BYOL and SimCLR do. Every value
that depends on κ (lr, betas / alpha, eps, weight decay) is written by `apply_plan` from
`emarule.scaling.scale(spec, κ)` — never derived here — so that Progressive Scaling can rewrite
them whenever κ changes.
"""

from __future__ import annotations

import torch
from torch import nn

from emarule.config.schema import OPTIMIZER_MOMENTUM
from emarule.config.typed import Config, config_of
from emarule.errors import UserError

SUPPORTED = ("sgd", "lars", "adam", "adamw", "rmsprop", "lamb")


class LARS(torch.optim.Optimizer):
    """SGD with heavy-ball momentum and a layer-wise trust ratio (You et al., 2017; BYOL's variant).

    For each tensor with `lars_adapt`: g ← g + λθ, g ← g · η_tc ‖θ‖ / ‖g‖ (1 when a norm is 0);
    then v ← μ v + g, θ ← θ − η v. Tensors without `lars_adapt` take plain SGD with momentum.
    """

    def __init__(self, params, lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                 trust_coefficient: float = 0.001, lars_adapt: bool = True):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      trust_coefficient=trust_coefficient, lars_adapt=lars_adapt))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if group["weight_decay"]:
                    g = g.add(p, alpha=group["weight_decay"])
                if group["lars_adapt"]:
                    pn, gn = torch.linalg.vector_norm(p), torch.linalg.vector_norm(g)
                    one = torch.ones_like(pn)
                    trust = torch.where((pn > 0) & (gn > 0), group["trust_coefficient"] * pn / gn, one)
                    g = g.mul(trust)
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = g.clone()
                else:
                    buf.mul_(group["momentum"]).add_(g)
                p.add_(buf, alpha=-group["lr"])
        return loss


class LAMB(torch.optim.Optimizer):
    """Adam moments with a layer-wise trust ratio (You et al., 2020).

    r = m̂ / (√v̂ + ε) + λθ; θ ← θ − η · (‖θ‖ / ‖r‖) · r for tensors with `lars_adapt`.
    """

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.0,
                 lars_adapt: bool = True):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      lars_adapt=lars_adapt))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["m"] = torch.zeros_like(p)
                    state["v"] = torch.zeros_like(p)
                state["step"] += 1
                t = state["step"]
                state["m"].mul_(b1).add_(p.grad, alpha=1 - b1)
                state["v"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                m_hat = state["m"] / (1 - b1**t)
                v_hat = state["v"] / (1 - b2**t)
                r = m_hat / (v_hat.sqrt() + group["eps"])
                if group["weight_decay"]:
                    r.add_(p, alpha=group["weight_decay"])
                if group["lars_adapt"]:
                    pn, rn = torch.linalg.vector_norm(p), torch.linalg.vector_norm(r)
                    trust = torch.where((pn > 0) & (rn > 0), pn / rn, torch.ones_like(pn))
                    r.mul_(trust)
                p.add_(r, alpha=-group["lr"])
        return loss


def param_groups(model: nn.Module, no_decay: set, skip: bool, aux: frozenset = frozenset(),
                 aux_lr_ratio: float = 1.0) -> list[dict]:
    """[decay, no_decay, aux] groups; their flags (`no_decay`, `lr_ratio`) survive state_dict round trips."""
    decay, plain, extra = [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if name in aux:
            extra.append(p)
        else:
            (plain if skip and name in no_decay else decay).append(p)
    groups = [{"params": decay, "no_decay": False, "lr_ratio": 1.0}]
    if plain:
        groups.append({"params": plain, "no_decay": True, "lr_ratio": 1.0})
    if extra:
        groups.append({"params": extra, "no_decay": True, "lr_ratio": float(aux_lr_ratio)})
    return groups


def build(cfg: Config | dict, model: nn.Module, no_decay: set, plan, aux: frozenset = frozenset(),
          aux_lr_ratio: float = 1.0) -> torch.optim.Optimizer:
    """The optimizer the typed config (or the spec) names, its values written from the plan."""
    opt = config_of(cfg).optimizer
    name = opt.name
    if name not in SUPPORTED:
        raise UserError(f"optimizer.name {name!r} cannot train a model; use one of {', '.join(SUPPORTED)}")
    unknown = (set(no_decay) | set(aux)) - {n for n, _ in model.named_parameters()}
    if unknown:
        raise UserError(f"task error: no_decay/aux_params name parameters the model lacks: {sorted(unknown)[:3]}")
    groups = param_groups(model, no_decay, bool(opt.weight_decay_skip_bias), frozenset(aux),
                          aux_lr_ratio)
    lr = plan["optimizer.lr"]
    if name == "sgd":
        o = torch.optim.SGD(groups, lr=lr, momentum=heavy_ball(opt), nesterov=bool(opt.nesterov))
    elif name == "lars":
        o = LARS(groups, lr=lr, momentum=heavy_ball(opt), trust_coefficient=opt.trust_coefficient)
    elif name in ("adam", "adamw"):
        cls = torch.optim.Adam if name == "adam" else torch.optim.AdamW
        o = cls(groups, lr=lr)
    elif name == "rmsprop":
        o = torch.optim.RMSprop(groups, lr=lr, momentum=heavy_ball(opt))
    else:
        o = LAMB(groups, lr=lr)
    for g in o.param_groups:
        if name in ("lars", "lamb"):
            g["lars_adapt"] = not g["no_decay"]
    apply_plan(o, plan, lr)
    return o


def heavy_ball(opt) -> float:
    """optimizer.momentum, or the optimizer's own where the spec leaves it out (schema.OPTIMIZER_MOMENTUM)."""
    return float(OPTIMIZER_MOMENTUM[opt.name] if opt.momentum is None else opt.momentum)


def apply_plan(optimizer: torch.optim.Optimizer, plan, lr: float) -> None:
    """Write the plan's scaled optimizer values (and this step's lr) into every param group."""
    wd = plan.get("optimizer.weight_decay", 0.0) or 0.0
    betas = plan.get("optimizer.betas")
    alpha = plan.get("optimizer.alpha")
    eps = plan.get("optimizer.eps")
    for g in optimizer.param_groups:
        g["lr"] = lr * g.get("lr_ratio", 1.0)
        g["weight_decay"] = 0.0 if g.get("no_decay") else wd
        if betas is not None and "betas" in g:
            g["betas"] = tuple(betas)
        if alpha is not None and "alpha" in g:
            g["alpha"] = alpha
        if eps is not None and "eps" in g:
            g["eps"] = eps


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for g in optimizer.param_groups:
        g["lr"] = lr * g.get("lr_ratio", 1.0)
