"""Speech recognition with a CTC transformer (§3.2, §3.3, App. G): `ctc-polyak` and `ctc-pseudo-label`.

The parts handed to the shared loop (`emarule.engine.loop.train`):

- `model`: `emarule.speech.model.CTCTransformer` (conv stride 3, post-LN encoder, CAPE, linear to 29 tokens).
- `train_set`: slots measured in seconds (`batch.unit: seconds`, `duration`); the engine packs dynamic
  batches of κB seconds with padding counted. `emarule.speech.data` explains the slots.
- `loss`: CTC summed over utterances (no length normalization, as the paper) divided by the micro-batch's
  seconds of audio — the engine's contract for seconds batches. In pseudo-labeling's pre-training those are
  the labeled stand-ins' seconds, not the slots' planned ones, so `loss_measure` hands the engine the same
  seconds to weight micro-batches by. SpecAugment from `specaug.start_steps`
  base steps, masks drawn from (seed, epoch, slot). With pseudo-labeling on, the teacher (the main EMA,
  in eval mode: no dropout, layer drop or CAPE augmentation) transcribes the clean unlabeled audio
  greedily (hard transcription) and the student learns those transcripts on augmented audio.
- evaluations: greedy WER (jiwer) on each `data.eval_splits` split for the target and every EMA
  (`wer`, `ema_wer`, `ema_wer/0.9999`, `wer/test-clean`, ...), and with pseudo-labeling `pl_wer`: the
  teacher's transcripts of held unlabeled utterances against their truth (pseudo-label quality).
- `on_step`/`state`: the pseudo-labeling phase (`emarule.speech.pseudo_label`): its start, the EMA's start
  moving with it, and dropout and layer drop lowered to 0.1.

Data (`data.source`): LibriSpeech from `--data ROOT`, or `synthetic`, the generated corpus
(`emarule.speech.corpus`) written in LibriSpeech's layout and read by the same loader.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from emarule.engine.context import RunContext, default_run_name
from emarule.errors import UserError
from emarule.engine.seeding import mix
from emarule.speech import corpus, pseudo_label, tokens, wer
from emarule.speech.data import EvalSet, TrainSlots, collate_eval, collate_train
from emarule.speech.features import LogMel
from emarule.speech.librispeech import SpeechSet, list_split
from emarule.speech.model import CTCTransformer
from emarule.speech.specaugment import SpecAugment
from emarule.engine.interface import MAIN_EMA, Evaluation, TaskParts

CACHE_HOURS = 3.0  # keep features in memory for sets up to this much audio


# --- data ---------------------------------------------------------------------------------------


def data_root(ctx: RunContext) -> Path:
    cfg = ctx.cfg
    data, c = cfg.data, cfg.corpus
    labeled = data.labeled
    unlabeled = data.unlabeled if cfg.pseudo_label else ()
    distinct_splits(labeled, list(unlabeled), list(data.eval_splits))
    if data.source == "synthetic":
        n_eval = int(c.eval)
        wanted = {labeled: int(c.labeled), **{u: int(c.unlabeled) for u in unlabeled},
                  **{e: n_eval for e in data.eval_splits}}
        req = corpus.CorpusRequest(seed=int(c.seed), utterances=wanted, speakers=int(c.speakers))
        return corpus.ensure(req, Path(c.dir).expanduser() if c.dir else None)
    root = ctx.data if ctx.data is not None else (Path(data.path) if data.path else None)
    if root is None:
        raise UserError(f"{ctx.experiment} reads LibriSpeech: pass --data ROOT (ROOT/{labeled}/<speaker>/<chapter>/"
                        f"*.flac, nothing is downloaded), or use --preset cpu for the generated corpus")
    if not Path(root).is_dir():
        raise UserError(f"--data {root}: not a directory; point it at the folder holding {labeled}/")
    return Path(root)


def distinct_splits(labeled: str, unlabeled: list, evals: list) -> None:
    """Each split has one role: evaluated on the training split a WER is a training score, and the generated
    corpus, which sizes each split by its role, would give that split one size for both."""
    roles = [("data.labeled", labeled)] + [("data.unlabeled", u) for u in unlabeled] + \
        [("data.eval_splits", e) for e in evals]
    seen: dict = {}
    for key, split in roles:
        if split in seen:
            where = key if seen[split] == key else f"{seen[split]} and {key}"
            raise UserError(f"split {split!r} is named twice ({where}); a split is trained on, pseudo-labeled "
                            f"or evaluated, once: remove it from {key}")
        seen[split] = key


def speech_set(root: Path, split: str, featurizer: LogMel, sample_rate: int, limit: int | None = None,
               trains: bool = False, skip_bad: bool = False) -> SpeechSet:
    """A split's utterances. A file too short for one feature window is refused here, before the run writes
    anything, except in a training split under data.skip_bad_items (`skip_bad`): the loop skips and counts it."""
    short_ok = trains and skip_bad
    utts = list_split(root, split, sample_rate, limit, min_samples=0 if short_ok else featurizer.min_samples,
                      skippable=trains)
    return SpeechSet(utts, featurizer, cache=sum(u.seconds for u in utts) <= CACHE_HOURS * 3600)


# --- loss ---------------------------------------------------------------------------------------


def specaug_masks(shape, frames, index, epoch: int, seed: int, sa: SpecAugment) -> torch.Tensor:
    """(B, T, n_mels) multiplicative masks, each a pure function of (seed, epoch, slot index)."""
    ones = torch.ones(shape[1], shape[2])
    out = []
    for n, i in zip(frames.tolist(), index.tolist(), strict=True):
        gen = torch.Generator().manual_seed(mix(seed, epoch, i, 0x5EC))
        out.append(sa(ones, int(n), gen))
    return torch.stack(out)


@torch.no_grad()
def transcribe(teacher, feats: torch.Tensor, frames: torch.Tensor) -> list[list[int]]:
    """Hard transcriptions (repeats merged, blanks dropped) by the teacher in eval mode."""
    was = teacher.training
    teacher.eval()
    try:
        log_probs, lengths = teacher(feats, frames)
    finally:
        teacher.train(was)
    best = log_probs.argmax(-1).cpu()
    return [tokens.collapse(best[b, :int(n)].tolist()) for b, n in enumerate(lengths.cpu())]


def with_pseudo_labels(targets: torch.Tensor, lengths: torch.Tensor, unlabeled: torch.Tensor,
                       hard: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's CTC targets with each unlabeled row's (empty) transcript replaced by its pseudo-label."""
    own = torch.split(targets.cpu(), lengths.cpu().tolist())  # one chunk per row, empty for unlabeled rows
    labels = iter(hard)
    rows = [torch.tensor(next(labels), dtype=torch.long) if u else own[k] for k, u in enumerate(unlabeled.tolist())]
    return torch.cat(rows).to(targets.device), torch.tensor([len(r) for r in rows], device=lengths.device)


def trained_view(batch: dict, phase: pseudo_label.Phase | None) -> dict:
    """The rows the loss trains on: before pseudo-labeling, an unlabeled slot's labeled stand-in."""
    pl = phase is not None and phase.pseudo_labeling
    return batch["main"] if pl or "stand_in" not in batch else batch["stand_in"]


def make_loss_measure(phase: pseudo_label.Phase):
    """The seconds the loss divides by: the engine weights micro-batches by them, so that a step cut into
    micro-batches has the whole batch's gradient although a stand-in is not its slot's length."""
    return lambda batch: float(trained_view(batch, phase)["seconds"].sum())


def make_loss(sa: SpecAugment, sa_start: float, seed: int, phase: pseudo_label.Phase | None):
    def loss(model, teacher, batch, now):
        pl = phase is not None and phase.pseudo_labeling
        view = trained_view(batch, phase)
        feats, frames, seconds = view["feats"], view["frames"], view["seconds"]
        targets, target_lengths = view["targets"], view["target_lengths"]
        unlabeled = batch["unlabeled"]
        if pl and bool(unlabeled.any()):
            hard = transcribe(teacher, feats[unlabeled], frames[unlabeled])
            targets, target_lengths = with_pseudo_labels(targets, target_lengths, unlabeled, hard)
        if now.base_step >= sa_start:
            feats = feats * specaug_masks(feats.shape, frames, batch["index"], int(batch["epoch"]), seed,
                                          sa).to(feats.device, feats.dtype)
        log_probs, lengths = model(feats, frames)
        ctc = F.ctc_loss(log_probs.transpose(0, 1), targets, lengths, target_lengths, blank=tokens.BLANK,
                         reduction="sum", zero_infinity=True)
        value = ctc / seconds.sum().to(ctc.dtype)
        metrics = {"ctc_loss": value.item()}
        if phase is not None:  # every micro-batch logs the same keys: the loop reduces them in one vector
            metrics["phase"] = float(pl)
            unl_s = float(seconds[unlabeled].sum()) if pl else 0.0
            metrics["unlabeled_share"] = unl_s / float(seconds.sum())
        return value, metrics

    return loss


# --- evaluations --------------------------------------------------------------------------------


def wer_evaluation(data: EvalSet, split: str, name: str, every_base_steps, target: dict, phase=None,
                   models: str = "all", only_when_pseudo_labeling: bool = False) -> Evaluation:
    """Greedy-decoding WER in percent; on the main split it also hands the target's WER to `phase`."""

    def score(net, batch, now):
        if only_when_pseudo_labeling and not (phase is not None and phase.pseudo_labeling):
            return {}
        log_probs, lengths = net(batch["feats"], batch["frames"])
        errors, words = wer.counts(batch["texts"], tokens.greedy(log_probs, lengths))
        out = {"errors": errors, "words": words}
        if phase is not None and not split and models == "all":
            out["target"] = float(net is target["model"])
        return out

    def finish(sums):
        if not sums:
            return {}
        value = wer.percent(sums["errors"], sums["words"])
        if sums.get("target"):
            phase.last_dev_wer = value
        return {name: value}

    return Evaluation(data=data, score=score, finish=finish, split=split, models=models,
                      every_epochs=None if every_base_steps else 1.0, every_base_steps=every_base_steps,
                      batch_size=32, collate=collate_eval)


# --- assembly -----------------------------------------------------------------------------------


def build(ctx: RunContext) -> TaskParts:
    cfg = ctx.cfg
    data, m, pl, sa_cfg = cfg.data, cfg.model, cfg.pseudo_label, cfg.specaug
    if int(m.vocab) != tokens.VOCAB:
        raise UserError(f"model.vocab must be {tokens.VOCAB}: 26 letters, apostrophe, word boundary and the CTC blank")
    sample_rate = int(data.sample_rate)
    featurizer = LogMel(sample_rate, int(data.n_mels), float(data.window_ms), float(data.stride_ms))
    root = data_root(ctx)
    skip_bad = bool(data.skip_bad_items)
    labeled = speech_set(root, data.labeled, featurizer, sample_rate, trains=True, skip_bad=skip_bad)
    phase = unlabeled = None
    if pl:
        parts = [speech_set(root, u, featurizer, sample_rate, trains=True, skip_bad=skip_bad) for u in data.unlabeled]
        if not parts:
            raise UserError(f"{ctx.experiment}: pseudo-labeling needs data.unlabeled splits")
        unlabeled = SpeechSet([u for p in parts for u in p.utts], featurizer, cache=all(p.cache is not None
                                                                                         for p in parts))
        pretrain = float(pl.pretrain_steps)
        ema_start = float(cfg.ema.start_steps)
        sibling = ctx.out.parent / default_run_name(1.0, "exponential", ctx.seed, None, ctx.spec.get("preset"))
        mode, threshold, source = pseudo_label.choose(pl, ctx.kappa, ctx.out, sibling, pretrain)
        latest = pl.latest_start_steps
        phase = pseudo_label.Phase(mode, pretrain, max(0.0, pretrain - ema_start), threshold,
                                   None if latest is None else float(latest))
        if mode == "wer" and not ctx.quiet:
            print(f"pseudo-labeling starts when the dev WER reaches {threshold:.4g}% (from {source})",
                  file=sys.stderr)
    train_set = TrainSlots(labeled, unlabeled, int(pl.labeled_ratio), int(pl.unlabeled_ratio))

    torch.manual_seed(mix(ctx.seed, 0xC7C))  # the same initial weights for every κ and rule at a seed
    model = CTCTransformer(featurizer.fbank.shape[1], tokens.VOCAB, int(m.dim), int(m.layers), int(m.heads),
                           int(m.mlp_dim), float(m.dropout), float(m.layer_drop), int(m.conv_kernel),
                           int(m.conv_stride), float(data.stride_ms) / 1000, m.positional)
    if phase is not None:
        phase.on_start = lambda: model.set_dropout(float(pl.dropout_after), float(pl.layer_drop_after))

    target = {"model": model}
    every = cfg.eval.every_base_steps
    splits = data.eval_splits
    evaluations = [wer_evaluation(EvalSet(speech_set(root, sp, featurizer, sample_rate)), "" if i == 0 else sp,
                                  "wer", every, target, phase)
                   for i, sp in enumerate(splits)]
    if phase is not None:
        # evaluation items are never skipped: the probe leaves out what training skips for being too short
        long_enough = [u for u in unlabeled.utts if round(u.seconds * sample_rate) >= featurizer.min_samples]
        held = SpeechSet(long_enough[:int(data.pl_eval_utterances)], featurizer, cache=unlabeled.cache is not None)
        evaluations.append(wer_evaluation(EvalSet(held), "", "pl_wer", every, target, phase, models="teacher",
                                          only_when_pseudo_labeling=True))

    sa = SpecAugment(int(sa_cfg.freq_masks), int(sa_cfg.freq_param), int(sa_cfg.time_masks), int(sa_cfg.time_param),
                     float(sa_cfg.time_ratio))

    def on_step(now, reduced):
        if phase is None:
            return
        if phase.mode == "wer" and phase.ema_started_at is None:
            if phase.threshold_reached(now.base_step):  # the EMA starts now; pseudo-labeling `ema_lead` later
                phase.ema_started_at = now.base_step
                for e in now.emas.values():
                    e.start_samples = now.seen
            else:
                for e in now.emas.values():
                    e.start_samples = math.inf
        if phase.due(now.base_step):
            phase.start(now.base_step)

    seconds = sum(train_set.seconds(i) for i in range(len(train_set)))
    info = {"task": "ctc", "model": f"CTC transformer {m.layers}×{m.dim} (post-LN, CAPE)",
            "parameters": sum(p.numel() for p in model.parameters()), "data_root": str(root),
            "labeled_utterances": len(labeled), "train_slots": len(train_set), "train_hours": seconds / 3600,
            "labeled_repeats": train_set.repeats, "eval_splits": list(splits)}
    if phase is not None:
        info.update({"unlabeled_utterances": len(unlabeled), "pseudo_label_start": phase.mode,
                     "latest_start_steps": phase.latest,
                     "start_wer_threshold": phase.threshold})
    return TaskParts(model=model, train_set=train_set, loss=make_loss(sa, float(sa_cfg.start_steps),
                                                                      ctx.seed, phase),
                     teacher=MAIN_EMA if phase is not None else None, evaluations=evaluations, on_step=on_step,
                     loss_measure=make_loss_measure(phase) if phase is not None else None,
                     state=phase, duration=train_set.seconds, progress_metric="ctc_loss", collate=collate_train,
                     info=info)
