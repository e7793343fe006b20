"""Each task's own spec sections (`model`, `data` and its named section), torch-free.

A task's `TaskSpec` (emarule/registry/__init__.py) points at its constant here, so that a spec is checked and
planned without importing the task module, which may import torch. The sections every spec shares are
`schema.COMMON`.
"""

from __future__ import annotations

from typing import Any

from emarule.registry.fields import (NONNEG, POSITIVE, SKIP_BAD_ITEMS, Field, flag, integer, momentum, num, numlist,
                                   text, with_defaults)

# The vision tasks' data.augment_on (emarule/vision/device_views.py)
AUGMENT_ON = text("where the training views are made: cpu (whole, in the loader's workers) or device (the workers "
                  "crop; the training device colours and normalizes, emarule/vision/device_views.py)",
                  choices=("cpu", "device"))

TOY: dict[str, Any] = {  # engine tests: a generated regression (emarule/tasks/toy.py)
    "toy": {
        "samples": integer(lo=1), "eval_samples": integer(lo=1), "dim": integer(lo=1), "hidden": integer(lo=1),
        "out": integer(lo=1), "noise": num(**NONNEG), "augment": num(**NONNEG), "batchnorm": flag(),
        "dropout": num(lo=0.0, hi=0.9),
        "teacher_weight": num(**NONNEG), "step_delay": num(**NONNEG), "threads": integer(lo=1),
        "checkpoint_every_epochs": num(**POSITIVE), "quiet": flag(), "seconds": flag(),
        "center_momentum": momentum(),
    },
}
TOY = with_defaults(TOY, {
    "toy.augment": 0.0, "toy.batchnorm": False, "toy.dim": 8, "toy.dropout": 0.0, "toy.eval_samples": 128,
    "toy.hidden": 16, "toy.noise": 0.1, "toy.out": 2, "toy.quiet": False, "toy.samples": 256, "toy.seconds": False,
    "toy.step_delay": 0.0, "toy.teacher_weight": 0.0
})

PARABOLA: dict[str, Any] = {
    "parabola": {
        "a": num("curvature", **POSITIVE),
        "b": num("noise scaled by the gradient squared", **NONNEG),
        "c": num("additive noise", **NONNEG),
        "theta0": num("norm of the initial position", **POSITIVE),
        "kappas": numlist("scalings to sweep", item=num(**POSITIVE)),
        "rho_bases": numlist("base momenta ρ_B", item=momentum()),
        "dims": numlist("dimensions D", item=integer(lo=1)),
        "seeds": integer("Monte Carlo seeds for D=1 when d1_method is montecarlo (both halves)", lo=2),
        "seed_dim_product": integer("seeds × D for each D > 1 (both halves of the hold-out)", lo=2),
        "d1_method": text("D=1: exact first moment, or Monte Carlo with a hold-out",
                          choices=("exact", "montecarlo")),
        "conventions": Field((list,), items=text(choices=("pre", "post")),
                             doc="EMA from θ_k (pre, the paper's Definition) and/or θ_{k+1} (post)"),
        "search_points": integer("Monte Carlo: grid points per run on which ρ* is chosen", lo=2),
        "nodes": integer("Chebyshev nodes across the bracket of ρ*", lo=5),
        "figure_kappas": numlist("κ shown in Fig. 1a", item=integer(lo=1)),
        "workers": integer("processes (one per configuration at a time)", lo=1),
        "seed": integer(),
    },
}
PARABOLA = with_defaults(PARABOLA, {
    "parabola.conventions": ["pre", "post"], "parabola.d1_method": "exact", "parabola.search_points": 128,
    "parabola.nodes": 13, "parabola.figure_kappas": [8, 256], "parabola.seed": 0, "parabola.workers": 1,
})

PRECISION: dict[str, Any] = {
    "precision_study": {  # steps, lr and batch come from schedule.total_steps, optimizer.lr, batch.size
        "features": integer("regression weights per repeat", lo=1),
        "samples": integer("training samples per repeat", lo=1),
        "noise": num("label noise standard deviation", **NONNEG),
        "init_std": num("standard deviation of the initial weights (0: start at zero)", **NONNEG),
        "momenta": numlist(item=momentum()),
        "dtypes": Field((list,), items=text(choices=("fp32", "bf16", "fp16")),
                        doc="dtypes the model and EMA weights are held in (fp32 is the reference)"),
        "repeats": integer("independent regressions, for the spread of MaxAbsDiff", lo=2),
        "seed": integer(),
    },
}
PRECISION = with_defaults(PRECISION, {
    "precision_study.init_std": 0.0, "precision_study.repeats": 5, "precision_study.seed": 0,
})

POLYAK: dict[str, Any] = {  # emarule/tasks/polyak.py
    "model": {"arch": text("a timm ResNetv2 (resnetv2_50)"), "num_classes": integer(lo=1),
              "init": text(choices=("kaiming_normal_relu", "default")),
              "width": integer("stem channels; stages 4·width … 32·width (64: the full model)", lo=1),
              "layers": Field((list,), items=integer(lo=1), length=4, doc="blocks per stage"),
              "stem": text("imagenet (7×7 conv, max-pool) or small (3×3 stride-2 conv)",
                           choices=("imagenet", "small")),
              "output_stride": integer("32 (the paper's); 16 dilates the last stage", choices=(8, 16, 32))},
    "data": {"source": text(choices=("imagenet", "textures")), "image_size": integer(lo=1),
             "augmentation": text(choices=("imagenet", "translate")), "label_smoothing": num(lo=0.0, hi=1.0),
             "path": text(nullable=True),
             "train_samples": integer("textures: training images", null_is_default=True, lo=1),
             "eval_samples": integer("textures: validation images", null_is_default=True, lo=1),
             "noise": num("textures: white noise std relative to the texture's", **NONNEG),
             "seed": integer("textures: the data set's seed (the same images for every run seed)", **NONNEG),
             "skip_bad_items": SKIP_BAD_ITEMS, "augment_on": AUGMENT_ON},
}
POLYAK = with_defaults(POLYAK, {
    "data.augment_on": "cpu", "data.augmentation": "imagenet", "data.image_size": 224, "data.label_smoothing": 0.0,
    "data.noise": 1.0,
    "data.seed": 0, "data.source": "imagenet", "data.train_samples": 4096, "data.eval_samples": 1024,
    "model.arch": "resnetv2_50", "model.init": "kaiming_normal_relu",
    "model.num_classes": 1000, "model.output_stride": 32, "model.stem": "imagenet"
})

CTC: dict[str, Any] = {
    "model": {
        "layers": integer(lo=1), "heads": integer(lo=1), "dim": integer(lo=1), "mlp_dim": integer(lo=1),
        "dropout": num(lo=0.0, hi=1.0), "layer_drop": num(lo=0.0, hi=1.0),
        "conv_kernel": integer(lo=1), "conv_stride": integer(lo=1), "vocab": integer(lo=2),
        "positional": text(choices=("cape", "sinusoidal", "relative")), "post_layernorm": flag(),
    },
    "data": {
        "labeled": text(), "unlabeled": Field((list,), items=text()), "path": text(nullable=True),
        "sample_rate": integer(lo=1), "n_mels": integer(lo=1), "window_ms": num(**POSITIVE),
        "stride_ms": num(**POSITIVE), "seconds_per_device": num(**POSITIVE), "devices": integer(lo=1),
        "source": text("LibriSpeech from --data, or the generated corpus", choices=("librispeech", "synthetic")),
        "eval_splits": Field((list,), items=text(), doc="evaluation splits; the first is the main one (wer)"),
        "pl_eval_utterances": integer("unlabeled utterances whose pseudo-labels are scored (pl_wer)", lo=1),
        "skip_bad_items": SKIP_BAD_ITEMS,
    },
    "corpus": {  # the generated corpus (data.source: synthetic), emarule/speech/corpus.py
        "seed": integer(), "speakers": integer("speakers per split", lo=1),
        "labeled": integer("utterances of the labeled split", lo=1),
        "unlabeled": integer("utterances of each unlabeled split", **NONNEG),
        "eval": integer("utterances of each evaluation split", lo=1),
        "dir": text("cache folder (default $EMARULE_CACHE or ~/.cache/emarule)", nullable=True),
    },
    "specaug": {
        "start_steps": integer(**NONNEG), "freq_masks": integer(**NONNEG), "freq_param": integer(**NONNEG),
        "time_masks": integer(**NONNEG), "time_ratio": num(lo=0.0, hi=1.0), "time_param": integer(**NONNEG),
    },
    "pseudo_label": {
        "pretrain_steps": integer(**NONNEG), "labeled_ratio": integer(lo=1), "unlabeled_ratio": integer(lo=1),
        "dropout_after": num(lo=0.0, hi=1.0), "layer_drop_after": num(lo=0.0, hi=1.0),
        "transcription": text(choices=("hard",)),
        "start": text("when pseudo-labeling starts: after pretrain_steps, when the dev WER reaches the baseline's, "
                      "or auto (steps for κ ≤ 2, wer above)", choices=("auto", "steps", "wer")),
        "start_wer": num("the baseline's dev WER (%) at its start of pseudo-labeling", nullable=True, **NONNEG),
        "start_wer_from": text("a κ=1 run directory to read that WER from", nullable=True),
        "latest_start_steps": num("base step by which pseudo-labeling starts in wer mode even if the WER "
                                  "never reaches the threshold (not the paper's)", nullable=True, **NONNEG),
    },
}
EVAL_SPLITS = ["dev-clean", "dev-other", "test-clean", "test-other"]  # LibriSpeech's
CTC = with_defaults(CTC, {
    "corpus.eval": 100, "corpus.labeled": 400, "corpus.seed": 0, "corpus.speakers": 8, "corpus.unlabeled": 0,
    "data.labeled": "train-clean-100", "data.unlabeled": [], "data.eval_splits": EVAL_SPLITS,
    "data.n_mels": 80, "data.pl_eval_utterances": 200, "data.sample_rate": 16000,
    "data.source": "librispeech", "data.stride_ms": 10, "data.window_ms": 25,
    "model.conv_kernel": 7, "model.conv_stride": 3, "model.positional": "cape",
    "model.vocab": 29,  # len(emarule.speech.tokens.SYMBOLS): blank, word boundary, apostrophe, a-z (a test holds it)
    "pseudo_label.labeled_ratio": 1, "pseudo_label.unlabeled_ratio": 3, "pseudo_label.pretrain_steps": 20000,
    "pseudo_label.dropout_after": 0.1, "pseudo_label.layer_drop_after": 0.1, "pseudo_label.start": "auto",
    "specaug.freq_masks": 2, "specaug.freq_param": 30, "specaug.start_steps": 0, "specaug.time_masks": 10,
    "specaug.time_param": 50, "specaug.time_ratio": 0.1
})

BYOL: dict[str, Any] = {
    "model": {
        "arch": text(), "width": integer(lo=1), "init": text(), "patch_size": integer(lo=1),
        "layers": Field((list,), items=integer(lo=1), length=4, nullable=True,
                        doc="resnet18/resnet34: basic blocks per stage (null: the arch's own)"),
        "stochastic_depth": num(lo=0.0, hi=1.0), "projector_hidden": integer(lo=1),
        "projector_out": integer(lo=1), "predictor_hidden": integer(lo=1),
        "head_norm": text("projector and predictor norm", choices=("batchnorm", "layernorm", "none")),
        "head_out_bias": flag("a bias on the projector's and predictor's output Linear (BYOL's has none)"),
        "embed_dim": integer("ViT width (narrow ViTs of the cpu/tiny presets)", nullable=True, lo=1),
        "depth": integer("ViT blocks", nullable=True, lo=1), "heads": integer("ViT heads", nullable=True, lo=1),
        "cifar_stem": flag("3x3 stem without max-pool for 32x32 inputs"),
    },
    "data": {
        "image_size": integer(lo=1), "augmentation": text(), "path": text(nullable=True),
        "num_classes": integer(lo=1),
        "source": text(choices=("cifar10", "imagenet", "digits", "shapes", "synthetic")),
        "train_samples": integer("cap on the training set (cpu/tiny presets)", nullable=True, lo=1),
        "eval_samples": integer(nullable=True, lo=1), "skip_bad_items": SKIP_BAD_ITEMS,
        "augment_on": AUGMENT_ON,
    },
    "probe": {"lr": num("the tracking probe's own Adam lr at batch.size (emarule/vision/probe.py)", **POSITIVE),
              "kind": text(choices=("pre-bn",))},
    "byol": {"loss_scale": num("the loss's factor: 1 is the paper's Definition (½cos + ½cos), 4 is BYOL's own "
                               "(2 − 2 cos similarity per view, summed over both)", **POSITIVE)},
}
BYOL = with_defaults(BYOL, {
    "byol.loss_scale": 1.0, "model.head_out_bias": False,
    "data.augment_on": "cpu", "data.augmentation": "byol_cifar10", "data.image_size": 32, "data.num_classes": 10,
    "data.source": "cifar10",
    "model.arch": "resnet18", "model.cifar_stem": False, "model.head_norm": "batchnorm",
    "model.init": "kaiming_uniform",
    "model.predictor_hidden": 4096, "model.projector_hidden": 4096, "model.projector_out": 256,
    "model.stochastic_depth": 0.0, "probe.kind": "pre-bn"
})

DINO: dict[str, Any] = {  # emarule/tasks/dino.py
    "model": {
        "arch": text(), "patch_size": integer(lo=1), "init": text(), "out_dim": integer(lo=1),
        "head_hidden": integer(lo=1), "bottleneck": integer(lo=1), "stochastic_depth": num(lo=0.0, hi=1.0),
        "head_layers": integer("Linear layers of the head's MLP", lo=1),
        "norm_last_layer": flag("last layer's row norms fixed at 1 (DINO's default)"),
        "embed_dim": integer("ViT width (narrow ViTs of the cpu/tiny presets)", nullable=True, lo=1),
        "depth": integer("ViT blocks", nullable=True, lo=1), "heads": integer("ViT heads", nullable=True, lo=1),
    },
    "data": {
        "image_size": integer("global crop size", lo=1), "augmentation": text(), "path": text(nullable=True),
        "global_crops": integer(lo=1), "local_crops": integer(**NONNEG), "local_size": integer(lo=1),
        "global_scale": numlist("area fraction range of a global crop", item=num(lo=0.0, hi=1.0), length=2),
        "local_scale": numlist("area fraction range of a local crop", item=num(lo=0.0, hi=1.0), length=2),
        "num_classes": integer(lo=1),
        "source": text(choices=("cifar10", "imagenet", "digits", "shapes", "synthetic")),
        "train_samples": integer("cap on the training set (cpu/tiny presets)", nullable=True, lo=1),
        "eval_samples": integer(nullable=True, lo=1), "skip_bad_items": SKIP_BAD_ITEMS,
        "augment_on": AUGMENT_ON,
    },
    "dino": {
        "center_momentum": momentum("center EMA ρ_c, unscaled in the paper"),
        "center_scale": flag("apply the EMA Scaling Rule to ρ_c"),
        "student_temp": num(**POSITIVE), "teacher_temp": num(**POSITIVE),
        "warmup_teacher_temp": num(**POSITIVE), "warmup_teacher_temp_epochs": integer(**NONNEG),
        "freeze_last_layer_epochs": num("the head's last layer is not trained before this epoch", **NONNEG),
    },
    "probe": {"lr": num(**POSITIVE), "kind": text(choices=("pre-bn",))},
}
DINO = with_defaults(DINO, {
    "data.augment_on": "cpu", "data.augmentation": "dino", "data.global_crops": 2,
    "data.global_scale": [0.4, 1.0], "data.local_scale": [0.05, 0.4],  # main_dino.py's crop scales
    "data.image_size": 224, "data.local_crops": 8,
    "data.local_size": 96, "data.num_classes": 10, "data.source": "cifar10", "dino.freeze_last_layer_epochs": 1,
    "dino.student_temp": 0.1, "dino.teacher_temp": 0.04, "dino.warmup_teacher_temp": 0.04,
    "dino.warmup_teacher_temp_epochs": 0, "model.arch": "vit_base_patch16_224", "model.bottleneck": 256,
    "model.head_hidden": 2048, "model.head_layers": 3, "model.norm_last_layer": True, "model.out_dim": 65536,
    "model.stochastic_depth": 0.0
})
