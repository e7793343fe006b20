"""The paper's claims, one `Family` per section: what to run, what to measure, what was said.

Torch-free. A family is either a κ sweep of a trainable experiment (`emarule sweep` runs: the κ=1
baseline and every κ with and without the EMA Scaling Rule, several seeds) whose claims are judged
on signed paired effects (`emarule.analysis.reproduce.judge`), or a study that sweeps κ or ρ itself in one
run (parabola, precision) whose claims are computed from its results.json
(`emarule.analysis.reproduce.studies`).

Claim kinds of a sweep family: `RULE_KINDS`; what each says, its shape and its margin are in `rules.KINDS`
(`emarule power --list` prints them), the effect each is judged on in `judge`.

A claim compares two settings, A and B (`Claim.settings`, ("with", "without") by default): "with" and
"without" are the standard sweep's runs at the claim's κ, any other name one of the family's `arms`,
extra settings the reproduction runs beside the sweep (an extra --set or --progressive; κ is the arm's).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

# A metric name ending in this is a further EMA's: the one with the smallest momentum of the spec's `ema.also`
# (`for_spec` names it); an axis label's `{split}` is the evaluation split the metric is computed on.
SHORTEST_ALSO = "{smallest ema.also}"

RULE_KINDS = ("rule_needed", "rule_departs", "rule_closer", "gap_remains", "same_either_way", "target_explains",
              "optimizer_strays", "with_better", "ema_above_target", "arm_closer", "matches_or_better")
STANDARD = ("with", "without")  # the sweep's own settings at a claim's κ; every other setting name is an arm's


@dataclass(frozen=True)
class Metric:
    name: str  # as logged in metrics.jsonl, or its key in `file`
    label: str  # axis label
    higher_is_better: bool
    depends_on_ema: bool  # False: the target model's own metric, blind to ρ (Polyak averaging)
    # Per-step training metrics are noisy at small batches: a trailing mean over this many epochs,
    # the same window for every run, before any gap is taken. 0 for evaluation metrics.
    smooth_epochs: float = 0.0
    # A JSON file in the run directory holding the metric's one value for the finished run (a measurement
    # made after training, at the run's last epoch); "" for a metric logged in metrics.jsonl.
    file: str = ""


@dataclass(frozen=True)
class Claim:
    text: str  # the paper's words
    paper: str  # where: "§3.2, Fig. 2" (line numbers of the .tex in `where`)
    kind: str  # one of RULE_KINDS, or a study check's name
    metric: str = ""  # the metric judged ("" for study checks, which name their own)
    kappa: float | None = None  # the κ judged; None: every κ of the sweep (with_better) or a study
    over: str = "run"  # "run": mean |Δ| over the whole run; "end": |Δ| at the end
    where: str = ""  # lines of the .tex
    note: str = ""  # our reading, where the paper's words leave a choice
    # "up to κ": judged once at every κ ≠ 1 of the sweep up to `kappa` ("we closely match the baseline
    # model until batch size 4096"); at `kappa` alone (not measured) when the sweep has none of them.
    up_to: bool = False
    # Judged only on the part of the run before this spec value, a count of base (κ=1) steps
    # ("pseudo_label.pretrain_steps": the pre-training phase, where the student is blind to the EMA).
    until: str = ""
    settings: tuple = STANDARD  # (A, B): A plays "with", B "without" in the decision rules
    short: str = ""  # one line for the README's table of claims (emarule/analysis/reproduce/table.py)
    ratio: float = 1.0  # rule_closer: the gap without must exceed this × the gap with ("≈ 3× smaller")
    # The κ where the paper's own range ends: a κ of the sweep beyond it is judged as a stand-in, and says so.
    stand_in_beyond: float | None = None
    mechanism: str = ""  # what the preset must have for the claim to be testable (`mechanisms.MECHANISMS`)
    # False for a claim about the EMA that is made where the optimizer rule strays (App. G's κ=4 comparison):
    # it is judged there, not set aside.
    gated: bool = True
    # The size the claim states, in the metric's units (0.2 for "0.2 % to 0.3 % higher"): its first part must
    # lie above it to be reproduced, and an absence is shown against it instead of one spread. 0: none stated.
    stated: float = 0.0


@dataclass(frozen=True)
class Arm:
    """A setting the reproduction runs beside the standard sweep, for every seed: `emarule run EXP --kappa
    κ [--no-ema-rule] --set ... --progressive ...`, into a run named `...-arm-<name>-s<seed>`."""

    name: str  # lowercase words and hyphens; never "with", "without", "baseline" or "linear"
    kappa: float
    rule: str | None = "exponential"  # None: without the EMA rule
    sets: tuple = ()  # --set KEY=VALUE overrides
    # --progressive: a schedule, or a function of the resolved spec (under the preset and `sets`) that
    # returns one, for a schedule tied to the preset ("step at the end of warm-up"). None: the spec's own
    # schedule, as the standard settings have it.
    progressive: object = None
    what: str = ""  # one line for the report
    # ((preset, κ), ...): the κ under a preset whose training set cannot hold a batch of κ × B (tiny's 128
    # digits at B = 32 hold κ ≤ 4); the claims on the arm are then judged at that κ, and say so.
    preset_kappa: tuple = ()

    def for_preset(self, preset: str | None) -> Arm:
        k = dict(self.preset_kappa).get(preset)
        return self if k is None else replace(self, kappa=float(k))

    def schedule(self, experiment: str, preset: str | None) -> str | None:
        if not callable(self.progressive):
            return self.progressive
        from emarule.config.load import load_spec

        return self.progressive(load_spec(experiment, None, preset, list(self.sets)))


def step_after_warmup(spec: dict) -> str:
    """Fig. 5 (right): the step to κ at the end of the preset's warm-up."""
    from emarule.config.typed import typed

    return f"step:{float(typed(spec).schedule.warmup_epochs):g}"


def step_in_warmup(spec: dict) -> str:
    """Fig. 5 (right)'s transition during warm-up: half-way through it (epoch 10 of the paper's 20)."""
    from emarule.config.typed import typed

    return f"step:{float(typed(spec).schedule.warmup_epochs) / 2:g}"


def slower_ramp(spec: dict) -> str:
    """App. H.10's second ramp: from the spec's start over twice its length (60 → 180 of 300 epochs), ending
    no later than half-way from the spec's end to the end of training (a ramp must end before it)."""
    from emarule.config.typed import typed

    cfg = typed(spec)
    a, b = float(cfg.progressive.start_epoch), float(cfg.progressive.end_epoch)
    end = min(2 * b - a, (b + float(cfg.schedule.epochs)) / 2)
    return f"smooth:{a:g}-{end:g}"


@dataclass(frozen=True)
class Family:
    name: str  # `emarule reproduce NAME`
    experiment: str  # emarule/experiments/<experiment>.yaml
    section: str
    kind: str  # "sweep" or "study"
    claims: tuple
    preset: str | None = "cpu"  # default --preset
    kappas: tuple = (1.0, 4.0)  # default --kappas
    seeds: tuple = (0, 1, 2, 3, 4)  # default --seeds
    arms: tuple = ()  # extra settings run beside the standard sweep (`Arm`)
    ema_metric: Metric | None = None  # the EMA-dependent metric (left panel)
    target_metric: Metric | None = None  # the target model's (right panel)
    more_metrics: tuple = ()  # further panels: a control EMA (`ema_wer/{smallest ema.also}`, see `for_spec`)
    x_axis: str = "epochs"  # or "reference steps" (samples or seconds seen / base batch)
    # The largest κ a --headline check runs for an "up to κ" claim: where the optimizer rule still holds.
    headline_kappa: float = 4.0
    # The target metric is blind to the EMA only before this spec value (base steps): the optimizer-rule
    # check and the claims it gates look at that part of the run ("pseudo_label.pretrain_steps").
    target_blind_until: str = ""
    full_scale: str = ""  # how the paper-scale version runs
    extra_claims: tuple = field(default_factory=tuple)  # claims that need full scale: listed, not judged
    headline: int = 0  # index in `claims` of the family's headline claim (`emarule reproduce --headline`)

    @property
    def metrics(self) -> tuple:
        return tuple(m for m in (self.ema_metric, self.target_metric, *self.more_metrics) if m is not None)

    def metric(self, name: str) -> Metric:
        for m in self.metrics:
            if m.name == name:
                return m
        raise KeyError(name)


def setting_key(family: Family, name: str, kappa: float | None) -> tuple:
    """A claim's setting name → its table row key: the standard ones at the claim's κ, an arm at its own."""
    for a in family.arms:
        if a.name == name:
            return name, float(a.kappa)
    return name, kappa


def headline_only(family: Family) -> Family:
    """The family cut to its headline claim and the runs that claim reads: the κ=1 baseline, the claim's κ
    (for an "up to κ" claim every κ of the sweep up to the family's `headline_kappa`, where the optimizer rule still
    holds: beyond it an EMA claim is set aside, so new seeds there would decide nothing), and only the arms
    its settings name. A verdict checked on seeds it was not tuned on needs no more than this
    (`--headline --seeds 100-104`)."""
    if family.kind != "sweep":
        return family
    claim = family.claims[family.headline]
    top = min(claim.kappa, family.headline_kappa) if claim.up_to else claim.kappa
    kappas = tuple(k for k in family.kappas if k == 1.0 or (k <= top if claim.up_to else k == top))
    arms = tuple(a for a in family.arms if a.name in claim.settings)
    return replace(family, claims=(claim,), kappas=kappas, arms=arms, extra_claims=())


def _full_scale(name: str, args: str, what: str) -> str:
    """How a family runs at the paper's scale: one process, or one per GPU under torchrun (8 here)."""
    cmd = f"emarule reproduce {name} {args}"
    return f"`{cmd}` ({what}; on 8 GPUs: `torchrun --nproc-per-node 8 -m {cmd}`)"


def _study(text, paper, check, where="", note="", kappa=None, short=""):
    return Claim(text=text, paper=paper, kind=check, kappa=kappa, where=where, note=note, short=short)


MATCH = ("… at scaling κ=8 or κ=256, the runs using the EMA Scaling Rule match the baseline trajectory, whereas the "
         "runs using the baseline momentum do not …")

PARABOLA = Family(
    name="parabola", experiment="parabola", section="§3.1, Fig. 1; App. F.1", kind="study", preset="paper",
    kappas=(), seeds=(),
    claims=(
        _study(MATCH, "§3.1, Fig. 1a", "parabola_match", "L692–694", kappa=8.0,
               short="§3.1 Fig. 1a: at κ=8 the rule matches the baseline EMA's trajectory, the unscaled ρ_B does not"),
        _study(MATCH, "§3.1, Fig. 1a", "parabola_match", "L692–694", kappa=256.0,
               short="§3.1 Fig. 1a: at κ=256 the rule matches the baseline EMA's trajectory, the unscaled ρ_B does "
                     "not"),
        _study("The scaling rule tracks the ρ* until κ=256 …", "§3.1, Fig. 1b", "parabola_tracks_rho_star", "L716",
               short="§3.1: the rule tracks the optimal momentum ρ* until κ=256"),
        _study("… when the ρ* become systematically higher", "§3.1, Fig. 1b", "parabola_rho_star_higher", "L716–717",
               short="§3.1: from κ=256 on, ρ* is systematically higher than the rule's ρ_B^κ"),
        _study("We see target model error increase at κ=256 … this indicates that the SGD Scaling Rule is breaking",
               "§3.1, Fig. 1b", "parabola_target_onset", "L718–719",
               note="read as an onset: the target's error grows faster into κ=256 than it does for κ ≤ 64",
               short="§3.1: the target model's error grows faster from κ=256 (read as an onset: the SGD rule "
                     "breaking)"),
        _study("At the lower scaling κ=64, there is an inflection point in the EMA Scaling Rule approximation error …",
               "§3.1, Fig. 1b", "parabola_inflection", "L720",
               short="§3.1: at κ=64, an inflection point in the rule's approximation error"),
        _study("… the approximation error at a given κ is higher for lower momenta ρ", "App. F.1",
               "parabola_lower_rho_worse", "L1896",
               short="App. F.1: at every κ, a lower ρ_B gives a higher approximation error"),
        _study("We observe no significant differences in the EMA scaling behavior as we vary dimensions",
               "§3.1; App. F.1 (D = 2, 16, 100)", "parabola_dimensions", "L723, L1915",
               short="§3.1, App. F.1: no significant difference in the scaling behaviour across D = 1, 2, 16, 100"),
        _study("… not changing the momentum at every scaling κ induces large approximation error …", "§3.1",
               "parabola_no_rule_large", "L724",
               short="§3.1: not changing ρ at every κ induces a large approximation error"),
    ),
    full_scale="already full scale: `emarule reproduce parabola` runs the paper's settings (the `paper` preset)",
)

PRECISION = Family(
    name="precision", experiment="precision", section="App. I, 'Additional details on numerical stability'",
    kind="study", preset=None, kappas=(), seeds=(),
    claims=(
        _study("… when model weights and EMA weights are FP16 (never done in practice), an increasing variance happens "
               "for FP16 as the value of the momentum ρ approaches 0.99999 …",
               "App. I, Fig. numerics", "precision_fp16_variance", "L3179",
               short="App. I: with weights and EMA in FP16, the variance grows as ρ → 0.99999"),
        _study("… whereas BF16 … [is] stable", "App. I, Fig. numerics", "precision_bf16_stable", "L3179",
               note="stable read by the sentence's FP16 clause: BF16's variance over repeats does not grow as "
                    "ρ → 0.99999",
               short="… whereas BF16 is stable: its variance does not grow as ρ → 0.99999"),
        _study("… whereas … FP32 [is] stable", "App. I, Fig. numerics", "precision_fp32_stable", "L3179",
               note="stable read as for BF16, on a second FP32 run (gradients summed in another order) against the "
                    "FP32 reference",
               short="… whereas FP32 is stable: its variance does not grow as ρ → 0.99999"),
        _study("… the minimum value of ρ corresponds to scaling κ=log(ρ_B)/log(1−ε) ≈ 4K, giving a batch size B ≈ 8M "
               "which is beyond current hardware feasibility …", "App. I",
               "precision_fp32_range", "L3164–3170",
               note="the baseline there is ρ_B = 0.996 at B = 4096, and ε ≈ 1.2e-7 is FP32's (L3164–3165)",
               short="App. I: at ρ_B = 0.996, B = 4096, FP32 keeps ρ meaningful from a batch below one sample up to "
                     "κ ≈ 4K, B ≈ 8M"),
    ),
    full_scale="already full scale: `emarule reproduce precision` runs the appendix's regression",
)


PROBE = Metric("probe_top1", "tracking-probe top-1 (%) on the teacher", True, True)
# The final teacher probed to convergence (offline_probe.offline_probe, cached in the run directory): what
# the teacher learned, without the tracking probe's lag behind a teacher that moves at another pace at κ > 1.
OFFLINE_PROBE = Metric("offline_probe_top1", "final teacher, converged probe top-1 (%)", True, True,
                       file="offline_probe.json")
PROBES = (PROBE.name, OFFLINE_PROBE.name)  # the metrics the probe check's data bar speaks for

BYOL_LOSS = Metric("byol_loss", "BYOL loss of the student (train)", False, True, smooth_epochs=0.5)
FIG5_RIGHT = ("At batch size 8192, we see a performance gap between the scaled model using the EMA Scaling Rule and "
              "the baseline … transitioning to the higher batch size during the warmup period results in a model "
              "optimization trajectory that diverges from the baseline, whereas transitioning after warmup results in "
              "matching final trajectories of the scaled and baseline models")

BYOL = Family(
    name="byol", experiment="byol-r18", section="§3.4, Fig. 5; App. H.1–H.2", kind="sweep", kappas=(1.0, 4.0),
    ema_metric=PROBE, target_metric=BYOL_LOSS, more_metrics=(OFFLINE_PROBE,),
    arms=(Arm("k8", 8.0, progressive="constant", what="κ=8 with the EMA rule, constant (Fig. 5 right's gap)",
              preset_kappa=(("tiny", 2.0),)),
          Arm("k8-after-warmup", 8.0, progressive=step_after_warmup, preset_kappa=(("tiny", 2.0),),
              what="κ=8 with the EMA rule, Progressive Scaling: the step to κ=8 at the end of warm-up"),
          Arm("k8-in-warmup", 8.0, progressive=step_in_warmup, preset_kappa=(("tiny", 2.0),),
              what="κ=8 with the EMA rule, Progressive Scaling: the step to κ=8 half-way through warm-up")),
    claims=(
        Claim("… without the EMA Scaling Rule, there is a drop in test top-1 linear probe performance compared to the "
              "baseline, whereas with the EMA Scaling Rule, we closely match the baseline model until batch size 4096",
              "§3.4, Fig. 5", "rule_needed", OFFLINE_PROBE.name, 4.0, "end", "L887", up_to=True,
              note="the final teachers, each probed to convergence: the tracking probe's last reading lags a "
                   "teacher that moves at another pace at κ > 1",
              short="§3.4 Fig. 5: the rule keeps the final teachers' probe on the baseline, without it it drops"),
        Claim("… without the EMA Scaling Rule, there is a drop in test top-1 linear probe performance compared to the "
              "baseline, whereas with the EMA Scaling Rule, we closely match the baseline model until batch size 4096",
              "§3.4, Fig. 5", "rule_needed", "probe_top1", 4.0, "run", "L887", up_to=True,
              short="§3.4 Fig. 5: the same over the run (the tracking probe)"),
        Claim(FIG5_RIGHT, "§3.4, Fig. 5 (right)", "gap_remains", OFFLINE_PROBE.name, 8.0, "end", "L889–890",
              settings=("k8", "with"),
              note="A: κ=8 with the rule and no Progressive Scaling (arm k8), against its seed's baseline; the "
                   "final teachers, each probed to convergence",
              short="§3.4 Fig. 5 (right): at κ=8 with the rule, the probe ends below the baseline"),
        Claim(FIG5_RIGHT, "§3.4, Fig. 5 (right)", "rule_needed", OFFLINE_PROBE.name, 8.0, "end", "L890–898",
              settings=("k8-after-warmup", "k8-in-warmup"),
              note="the paper steps at epoch 10 (during its 20-epoch warm-up) and at 30 (after it); here A steps "
                   "at the end of the preset's warm-up (arm k8-after-warmup) and B half-way through it (arm "
                   "k8-in-warmup), both with the rule: B departs from the baseline, A matches it; the final "
                   "teachers, each probed to convergence",
              short="§3.4 Fig. 5 (right): stepping to κ=8 during warm-up diverges, after it matches"),
    ),
    full_scale=_full_scale("byol", "--preset full --data /datasets/cifar10 --kappas 1,2,4",
                           "100 epochs of CIFAR-10 per run; the κ=8 arms run beside them"),
    extra_claims=(
        Claim("We show that this result is consistent for a range of base learning rates η_B and momenta ρ_B",
              "§3.4, App. H.8", "rule_needed", OFFLINE_PROBE.name, 4.0, "end", "L888",
              note="a grid of reproductions over η_B and ρ_B, each cell as long as this family's (6 runs a seed), "
                   "is not run; one cell is `emarule sweep byol-r18 --preset cpu --kappas 1,4 --seeds 5 --set "
                   "optimizer.lr=… --set ema.momentum=…`"),
    ),
    # The claim on the final teachers: at the cpu preset the tracking probe's last reading sits at the level
    # of a teacher at initialization (32.7 against 32.3 on the tuning seeds 200–202, where the converged
    # probe of the trained teachers reads 49.9), so it cannot tell how far a teacher is from its baseline.
    headline=0,
)

BYOL_VIT = Family(
    name="byol-vit", experiment="byol-vit", section="§3.4, Fig. 6; App. H", kind="sweep", kappas=(1.0, 4.0, 8.0),
    ema_metric=PROBE, target_metric=BYOL_LOSS,
    arms=(Arm("rule-only", 4.0, progressive="constant", what="the EMA rule only: no Progressive Scaling"),
          Arm("neither", 4.0, rule=None, progressive="constant",
              what="neither the EMA rule nor Progressive Scaling")),
    claims=(
        Claim("Progressive Scaling coupled with the EMA Scaling Rule is required when scaling BYOL ViTs, enabling "
              "baseline loss tracking …", "§3.4, Fig. 6", "rule_departs", "byol_loss", 4.0, "run", "L904–905",
              note="the standard settings are Fig. 6's Progressive Scaling arms (the spec's step): with = "
                   "progressive + EMA rule, without = progressive only; the paper gives no sign for the loss "
                   "mismatch, so the no-rule part is judged in either direction",
              short="§3.4 Fig. 6: Progressive Scaling + the rule track the loss, progressive alone does not"),
        Claim("Progressive Scaling coupled with the EMA Scaling Rule is required …", "§3.4, Fig. 6", "arm_closer",
              "byol_loss", 4.0, "run", "L904", settings=("with", "rule-only"),
              note="A: progressive + EMA rule; B: the EMA rule only (arm rule-only)",
              short="§3.4 Fig. 6: … closer than the EMA rule alone"),
        Claim("Progressive Scaling coupled with the EMA Scaling Rule is required …", "§3.4, Fig. 6", "arm_closer",
              "byol_loss", 4.0, "run", "L904", settings=("with", "neither"),
              note="A: progressive + EMA rule; B: neither (arm neither)", short="§3.4 Fig. 6: … closer than neither"),
        Claim("… there is only a small drop in 1.6% probe performance when using the EMA Scaling Rule, compared to as "
              "44.56% drop without it", "§3.4, Fig. 6", "rule_needed", "probe_top1", 8.0, "end", "L906–909",
              note="at the paper's κ: batch 32,768 = 8 × 4096, where perfect scaling fails; with and without both "
                   "use Progressive Scaling (the spec's step)",
              short="§3.4 Fig. 6: at κ=8 the probe drops little with the rule, much without it"),
        Claim("We also observe that it is sometimes possible to match test model performance using only Progressive "
              "Scaling and not the EMA Scaling Rule, although this still induces a training loss mismatch",
              "§3.4", "matches_or_better", "probe_top1", 4.0, "end", "L910–911", settings=("without", "with"),
              note="A: Progressive Scaling alone (the standard no-rule setting) against its seed's baseline",
              short="§3.4: Progressive Scaling alone can match the baseline's probe"),
    ),
    full_scale=_full_scale("byol-vit", "--preset full --data /datasets/imagenet --kappas 1,6",
                           "480 ImageNet epochs of a ViT-B/16 per run"),
)

BYOL_R50_LARS = Family(
    name="byol-r50-lars", experiment="byol-r50-lars", section="App. H.10", kind="sweep", kappas=(1.0, 4.0),
    ema_metric=PROBE, target_metric=BYOL_LOSS, more_metrics=(OFFLINE_PROBE,),
    arms=(Arm("slower-ramp", 4.0, progressive=slower_ramp,
              what="the EMA rule, the smooth ramp over twice the spec's length (the paper's 120 epochs)"),),
    claims=(
        Claim("… we are able to match or surpass the linear probe performance of the BYOL baseline at the larger batch "
              "size", "App. H.10", "matches_or_better", OFFLINE_PROBE.name, 4.0, "end", "L2922",
              note="the spec's smooth ramp (60 → 120 of 300 epochs, scaled to the preset) with the EMA rule; the "
                   "final teachers, each probed to convergence",
              short="App. H.10: LARS with the smooth ramp matches or surpasses the baseline's probe"),
        Claim("… we are able to match or surpass the linear probe performance of the BYOL baseline at the larger batch "
              "size", "App. H.10", "matches_or_better", OFFLINE_PROBE.name, 4.0, "end", "L2922",
              settings=("slower-ramp", "with"), note="the ramp over twice the length (arm slower-ramp); the final "
                                                       "teachers, each probed to convergence",
              short="App. H.10: the same with the ramp over twice the length"),
    ),
    # Both claims are about the end, so they read the final teachers' converged probe: on the shapes, at the
    # tuning seeds 200–202, the tracking probe's last reading at κ=1 sat near chance (27.2 at the cpu preset's
    # 5,000 images × 4 epochs; chance is 20) where the converged probe read 49.4 (byol-r50-lars.md).
    full_scale=_full_scale("byol-r50-lars", "--preset full --data /datasets/imagenet --kappas 1,8",
                           "300 ImageNet epochs of a ResNet-50 per run"),
)

BN_CLOSER = ("We observe that the Test Top-1 trajectories with the EMA Scaling Rule applied [to the BatchNorm "
             "coefficients] are slightly closer to the reference trajectories for scalings κ≥2 than those trajectories "
             "without the EMA Scaling Rule")

POLYAK = Family(
    name="polyak", experiment="polyak-r50", section="§3.2, Fig. 2; App. F.2–F.3", kind="sweep",
    kappas=(0.5, 1.0, 2.0, 4.0),  # Fig. 2 scales B = 1024 down to 512 and up to 4096 (L743–744)
    arms=(Arm("bn-scale", 2.0, sets=("norm.bn_scale=true",), what="κ=2 with the EMA rule on ρ_BN too (ρ_BN^κ)"),),
    ema_metric=Metric("ema_top1", "EMA test top-1 (%)", True, True),
    target_metric=Metric("top1", "target model test top-1 (%)", True, False),
    claims=(
        Claim("We match baseline EMA statistics across the full trajectory batch size 2048, where the test EMA "
              "performance diverges", "§3.2, Fig. 2", "rule_needed", "ema_top1", 2.0, "run", "L752",
              note="read as: the EMA trajectories match up to B = 2048 (κ=2) and diverge beyond it; App. F.2 "
                   "(L2076) puts the start of the gap at κ=4, and the next sentence blames the target model, which "
                   "the target_explains claim judges",
              short="§3.2 Fig. 2: the EMA matches the baseline over the run, without the rule it does not"),
        Claim("… without the EMA Scaling Rule, there is a significant drop in model EMA test performance, whereas with "
              "the EMA Scaling Rule, we can approximate the baseline model EMA test top-1 performance across all batch "
              "sizes", "§3.2, Fig. 2", "rule_needed", "ema_top1", 4.0, "end", "L751", up_to=True,
              mechanism="horizon_vs_last_stage",
              note="every κ of the sweep, κ=0.5 included (\"across all batch sizes\")",
              short="§3.2: without the rule the EMA drops, with it it matches (at the end)"),
        Claim("… a gap in EMA Test Top-1 trajectories begins at scaling κ=4 … the (non-EMA) Test Top-1 performance "
              "trajectory is no longer matching at these scalings, demonstrating that the problem is not due to a "
              "breakdown of the EMA Scaling Rule …", "§3.2; App. F.2", "target_explains", "ema_top1", 4.0, "run",
              "L752–753, L2076–2077", short="§3.2, App. F.2: the EMA gap from κ=4 is the target model's"),
        Claim("… model EMA top-1 is approximately 0.2% to 0.3% higher than the target model", "§3.2",
              "ema_above_target", "ema_top1", 1.0, "end", "L754", stated=0.2,
              note="the size the paper states, 0.2 points of top-1 (the lower end), is the size the effect must "
                   "exceed and the margin of an absence; a CPU preset's test set resolves about 0.1 point",
              short="§3.2: the EMA's top-1 is 0.2–0.3 % above the target's"),
        Claim(BN_CLOSER, "App. F.3", "arm_closer", "top1", 2.0, "run", "L2101–2102", settings=("bn-scale", "with"),
              note="A: κ=2 with the EMA rule and ρ_BN^κ (arm bn-scale); B: the same with ρ_BN unscaled",
              short="App. F.3: ρ_BN^κ brings the target's curves slightly closer"),
        Claim(BN_CLOSER, "App. F.3", "arm_closer", "ema_top1", 2.0, "run", "L2101–2102",
              settings=("bn-scale", "with"), note="the EMA's Test Top-1, A and B as above",
              short="App. F.3: … and the EMA's"),
    ),
    full_scale=_full_scale("polyak", "--preset full --data /datasets/imagenet --kappas 0.5,1,2,4",
                           "90 ImageNet epochs of a ResNetv2-50 per run"),
)

DINO = Family(
    name="dino", experiment="dino-vit", section="App. H.11", kind="sweep", kappas=(1.0, 2.0, 4.0), headline_kappa=2.0,
    ema_metric=PROBE,
    target_metric=Metric("dino_loss", "DINO loss of the student (train)", False, True, smooth_epochs=0.5),
    claims=(
        Claim("At batch size 2048, the training loss matches the reference only when the EMA Scaling Rule is applied, "
              "whereas the run without the scaling rule diverges from the reference", "App. H.11", "rule_departs",
              "dino_loss", 2.0, "run", "L3052", note="the paper gives no sign for the divergence: either direction",
              short="App. H.11 (DINO): at κ=2 the loss matches only with the rule"),
        Claim("[At batch size 4096] there is also a gap with the EMA Scaling Rule, however is approximately three "
              "times smaller than the gap without the EMA Scaling Rule", "App. H.11", "rule_closer", "dino_loss", 4.0,
              "run", "L3054", ratio=2.0,
              note="≈ 3× read as more than 2×: the paired effect is gap without − 2 × gap with",
              short="App. H.11: at κ=4 the gap with the rule is ≈ 3× smaller than without"),
        Claim("… using the EMA Scaling Rule always performs better in terms of linear probe performance than not using "
              "the scaling rule", "App. H.11", "with_better", "probe_top1", None, "end", "L3056",
              short="App. H.11: the rule always gives the better linear probe"),
    ),
    full_scale=_full_scale("dino", "--preset full --data /datasets/cifar10 --kappas 1,2,4",
                           "280 epochs of a ViT-B/16 per run"),
    extra_claims=(
        Claim("We also attempted to use a sharp batch size transition …, which leads to the collapse pheonomena "
              "observed in prior work. This collapse happens with and without the EMA Scaling Rule",
              "App. H.11", "rule_departs", "dino_loss", 4.0, "run", "L3098–3100",
              note="the paper gives no criterion for a collapse, and ties it to DINO's early phase at ViT-B/16 "
                   "scale (a step at epoch 100 of 280); a check needs one fixed in advance, such as the teacher's "
                   "output entropy at its maximum, and runs with the step (`--progressive`), which this family "
                   "does not run"),
    ),
)

# The short-horizon control EMA of App. G: the spec's smallest `ema.also` momentum.
SHORT_EMA_WER = Metric(f"ema_wer/{SHORTEST_ALSO}", "short-horizon EMA WER (%), {split}", False, True)

CTC_POLYAK = Family(
    name="ctc-polyak", experiment="ctc-polyak", section="§3.2, Fig. 3; App. G", kind="sweep",
    kappas=(1.0, 4.0, 8.0),  # κ=8: where the cpu preset's Adam rule breaks (emarule/experiments/ctc-polyak.yaml)
    ema_metric=Metric("ema_wer", "EMA WER (%), {split}", False, True),
    target_metric=Metric("wer", "target model WER (%), {split}", False, False),
    more_metrics=(SHORT_EMA_WER,),
    x_axis="reference steps",
    claims=(
        Claim("Without the EMA Scaling Rule, there is a significant difference in model EMA test WER trajectories "
              "compared to the baseline, whereas with the EMA Scaling Rule, trajectories match …", "§3.2, Fig. 3",
              "rule_needed", "ema_wer", 4.0, "run", "L762", up_to=True, stand_in_beyond=4.0,
              short="§3.2 Fig. 3 (ASR): with the rule the EMA's WER trajectory matches, without it it does not"),
        Claim("… the model EMA converges to similar final performance irrespective of use of the scaling rule",
              "§3.2, Fig. 3", "same_either_way", "ema_wer", 4.0, "end", "L763–764", up_to=True,
              stand_in_beyond=4.0, mechanism="training_vs_horizon",
              short="§3.2: the EMA converges to a similar final WER either way"),
        Claim("… a growing gap between the baseline and EMA-scaled trajectories as we increase κ. Inspecting the train "
              "loss and non-EMA test WER … indicates this is due to a breakdown of the Adam Scaling Rule",
              "§3.2; App. G, Fig. 9", "target_explains", "ema_wer", 4.0, "run", "L767–768", up_to=True,
              stand_in_beyond=4.0,
              short="§3.2, App. G: the growing gap with κ is the Adam rule breaking"),
        Claim("… for smaller values of ρ_B, scaling with or without EMA Scaling Rule behave similarly, and reference "
              "trajectories match …", "App. G, Fig. 10", "same_either_way", SHORT_EMA_WER.name, 4.0, "run", "L2357",
              stand_in_beyond=4.0,
              note="the paper's control is ρ_B = 0.999 beside 0.99995; ours is the further EMA with the smallest "
                   "momentum of the spec's ema.also, beside ema.momentum (the full recipe and tiny: 0.999 beside "
                   "0.99995; cpu: 0.9 beside 0.98)", up_to=True,
              short="App. G: for a small ρ_B, with and without the rule behave alike"),
    ),
    full_scale=_full_scale("ctc-polyak", "--preset full --data /datasets/LibriSpeech --kappas 0.25,1,2,4",
                           "400k steps of a 36-layer transformer"),
)

CTC_PL = Family(
    name="ctc-pseudo-label", experiment="ctc-pseudo-label", section="§3.3, Fig. 4; App. G", kind="sweep",
    # κ=2: where the paper's Adam rule still holds in pre-training, so the EMA claims apply there (§3.3);
    # κ=4: where it strays, and the paper postpones pseudo-labeling (emarule/experiments/ctc-pseudo-label.yaml).
    kappas=(1.0, 2.0, 4.0), headline_kappa=2.0, target_blind_until="pseudo_label.pretrain_steps",
    ema_metric=Metric("pl_wer", "pseudo-label WER of the teacher (%)", False, True),
    target_metric=Metric("wer", "student WER (%), {split}", False, True),
    x_axis="reference steps",
    claims=(
        Claim("When the EMA Scaling Rule is not used, Fig. 4 reveals a significant difference in PL quality "
              "trajectory … With this heuristic, we can match the baseline trajectory with the EMA Scaling Rule up "
              "to κ=8", "§3.3, Fig. 4", "rule_needed", "pl_wer", 8.0, "run", "L804, L810", up_to=True,
              mechanism="informative_pseudo_labels",
              short="§3.3 Fig. 4: the rule keeps the pseudo-label quality on the baseline"),
        Claim("When the EMA Scaling Rule is not used … a significant difference in PL quality trajectory, leading "
              "to a higher test WER", "§3.3, Fig. 4", "rule_needed", "wer", 8.0, "end", "L804", up_to=True,
              mechanism="informative_pseudo_labels",
              short="§3.3: without it, a higher test WER"),
        Claim("For κ > 2, we found the Adam Scaling Rule does not perfectly match the reference trajectory in the "
              "pre-training phase", "§3.3", "optimizer_strays", "wer", 4.0, "run", "L806",
              note="the student's WER over the pre-training phase only (pseudo_label.pretrain_steps base steps), "
                   "where it does not depend on the EMA", until="pseudo_label.pretrain_steps",
              short="§3.3: for κ > 2 the Adam rule strays in pre-training"),
        Claim("… if the Adam Scaling Rule does not hold perfectly … the EMA Scaling Rule also gives discrepancies with "
              "the reference trajectory, however they are negligible compared to the models without the EMA Scaling "
              "Rule", "App. G", "rule_closer", "pl_wer", 4.0, "run", "L2344–2346", ratio=2.0, gated=False,
              mechanism="informative_pseudo_labels",
              note="judged where the Adam rule strays (κ=4), as the paper makes it; \"negligible\" read as less "
                   "than half: the paired effect is gap without − 2 × gap with",
              short="App. G: where the Adam rule strays, the rule's discrepancy is small against no rule's"),
    ),
    full_scale=_full_scale("ctc-pseudo-label", "--preset full --data /datasets/LibriSpeech --kappas 0.5,1,2,4,8",
                           "500k steps"),
    extra_claims=(
        Claim("We see … that Progressive Scaling enables us to scale pseudo-labeling to κ=16 with … and without … "
              "the EMA Scaling Rule. Second, models with the EMA Scaling Rule track the baseline much closer than "
              "models without the EMA Scaling Rule, although a small gap is present",
              "App. G (κ=16)", "rule_closer", "pl_wer", 16.0, "run", "L2366–2371",
              note="needs pre-training at κ=8 and a step to κ=16 where pseudo-labeling begins; at the cpu preset the "
                   "Adam rule already strays in pre-training from κ=2 (the optimizer-rule check), so no EMA claim "
                   "applies at κ=16 there"),
    ),
)

FAMILIES = {f.name: f for f in (PARABOLA, PRECISION, POLYAK, BYOL, BYOL_VIT, BYOL_R50_LARS, DINO, CTC_POLYAK, CTC_PL)}

FULL = "full"  # --preset full: the experiment's base spec, the paper's recipe at full scale


def for_spec(family: Family, spec: dict) -> Family:
    """The family as a run's resolved spec has it. A metric named `NAME/{smallest ema.also}` becomes the further
    EMA with the smallest momentum of the spec's `ema.also`, named as the engine names it (`ema_wer/0.999`
    under the full recipe and tiny, `ema_wer/0.9` under cpu); without `ema.also` it keeps its placeholder
    name, which no run logs, so its claims are "not measured". `{split}` in an axis label becomes the split
    the metric is evaluated on, the first of `data.eval_splits`."""
    from emarule.scaling.plan import extra_ema_name
    from emarule.config.load import get
    from emarule.config.typed import typed

    also = [float(r) for r in typed(spec).ema.also]
    splits = get(spec, "data.eval_splits")  # as the run's record has it: a spec of any task, or a hand-made one
    split = str(splits[0]) if splits else "the evaluation split"

    def name(n: str) -> str:
        return n.replace(SHORTEST_ALSO, extra_ema_name(min(also))) if also else n

    def metric(m: Metric | None) -> Metric | None:
        return None if m is None else replace(m, name=name(m.name), label=m.label.replace("{split}", split))

    return replace(family, ema_metric=metric(family.ema_metric), target_metric=metric(family.target_metric),
                   more_metrics=tuple(metric(m) for m in family.more_metrics),
                   claims=tuple(replace(c, metric=name(c.metric)) for c in family.claims),
                   extra_claims=tuple(replace(c, metric=name(c.metric)) for c in family.extra_claims))
