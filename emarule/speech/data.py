"""Training and evaluation sets of the CTC task, and their collation into padded batches.

Training items are "slots" with a fixed duration (the engine plans dynamic batches from it). Without
pseudo-labeling every slot is a labeled utterance. With it (§3.3), the slots are the labeled set,
repeated so that labeled : unlabeled audio is as close to `labeled_ratio : unlabeled_ratio` (1 : 3)
as whole repeats allow, followed by the unlabeled set; an epoch's random order then mixes the two
by duration in that proportion. Before pseudo-labeling starts, an unlabeled slot stands for the
labeled utterance of the same duration rank (a quantile pairing), so pre-training sees labeled
audio only. Batches are planned, and `seconds_seen` counted, by the slots' durations; a stand-in is
near its slot's length, not equal to it, so a pre-training batch holds somewhat more or less labeled
audio than planned (on the cpu preset's corpus at 30 s batches: 83–105 % per batch, 97 % over an epoch).

Items do not depend on the phase: an unlabeled slot carries both its unlabeled audio and its
labeled stand-in, and the loss picks one by the phase in force. So a DataLoader worker that
prefetched before the switch hands over the right data after it, and an item stays a pure function
of (index, epoch, seed), as the engine requires.
"""

from __future__ import annotations

import torch

from emarule.speech.librispeech import SpeechSet


class TrainSlots:
    """Map-style training set over slots; `seconds(i)` is slot i's duration (the engine's measure)."""

    def __init__(self, labeled: SpeechSet, unlabeled: SpeechSet | None = None, labeled_ratio: int = 1,
                 unlabeled_ratio: int = 3):
        self.labeled, self.unlabeled = labeled, unlabeled
        self.repeats = 1
        self.stand_in: list[int] = []
        if unlabeled is not None and len(unlabeled):
            lab_s = sum(labeled.seconds(i) for i in range(len(labeled)))
            unl_s = sum(unlabeled.seconds(i) for i in range(len(unlabeled)))
            self.repeats = max(1, round(unl_s * labeled_ratio / (unlabeled_ratio * lab_s)))
            self.stand_in = quantile_pairing([labeled.seconds(i) for i in range(len(labeled))],
                                             [unlabeled.seconds(i) for i in range(len(unlabeled))])
        self.n_labeled = len(labeled) * self.repeats
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n_labeled + (len(self.unlabeled) if self.unlabeled is not None else 0)

    def seconds(self, i: int) -> float:
        if i < self.n_labeled:
            return self.labeled.seconds(i % len(self.labeled))
        return self.unlabeled.seconds(i - self.n_labeled)

    def labeled_item(self, j: int) -> dict:
        return {"feats": self.labeled.features(j), "targets": self.labeled.targets[j],
                "seconds": self.labeled.seconds(j), "text": self.labeled.utts[j].text}

    def __getitem__(self, i: int) -> dict:
        if i < self.n_labeled:
            item = self.labeled_item(i % len(self.labeled))
            return {"index": i, "epoch": self.epoch, "unlabeled": False, "main": item, "stand_in": item}
        u = i - self.n_labeled
        main = {"feats": self.unlabeled.features(u), "targets": [], "seconds": self.unlabeled.seconds(u),
                "text": self.unlabeled.utts[u].text}
        return {"index": i, "epoch": self.epoch, "unlabeled": True, "main": main,
                "stand_in": self.labeled_item(self.stand_in[u])}


def quantile_pairing(labeled: list[float], unlabeled: list[float]) -> list[int]:
    """For each unlabeled utterance, the labeled one at the same rank by duration (ranks rescaled)."""
    lab = sorted(range(len(labeled)), key=lambda i: (labeled[i], i))
    unl = sorted(range(len(unlabeled)), key=lambda i: (unlabeled[i], i))
    out = [0] * len(unlabeled)
    for rank, u in enumerate(unl):
        out[u] = lab[min(len(lab) - 1, rank * len(lab) // len(unl))]
    return out


def pad(items: list[dict]) -> dict:
    """Padded features (B, T, n_mels), frame counts, concatenated targets and their lengths, seconds."""
    feats = torch.nn.utils.rnn.pad_sequence([it["feats"] for it in items], batch_first=True)
    targets = [t for it in items for t in it["targets"]]
    return {"feats": feats, "frames": torch.tensor([it["feats"].shape[0] for it in items]),
            "targets": torch.tensor(targets, dtype=torch.long),
            "target_lengths": torch.tensor([len(it["targets"]) for it in items]),
            "seconds": torch.tensor([it["seconds"] for it in items], dtype=torch.float64),
            "texts": [it["text"] for it in items]}


def collate_train(items: list[dict]) -> dict:
    """Both views of a micro-batch: `main` (pseudo-labeling) and `stand_in` (pre-training)."""
    out = {"index": torch.tensor([it["index"] for it in items]), "epoch": torch.tensor(items[0]["epoch"]),
           "unlabeled": torch.tensor([it["unlabeled"] for it in items]), "main": pad([it["main"] for it in items])}
    if any(it["unlabeled"] for it in items):
        out["stand_in"] = pad([it["stand_in"] for it in items])
    return out


class EvalSet:
    """An evaluation split: (features, transcript) items."""

    def __init__(self, speech: SpeechSet):
        self.speech = speech

    def __len__(self) -> int:
        return len(self.speech)

    def __getitem__(self, i: int) -> dict:
        return {"feats": self.speech.features(i), "targets": [], "seconds": self.speech.seconds(i),
                "text": self.speech.utts[i].text}


def collate_eval(items: list[dict]) -> dict:
    return pad(items)
