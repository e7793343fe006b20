"""Speech maths: log-mel features against torchaudio's values, SpecAugment, tokens and greedy CTC decoding,
WER counts, CAPE positions, the model's shapes and the per-second CTC loss."""

import math

import pytest
import torch

from emarule.speech import tokens, wer
from emarule.speech.features import LogMel, mel_filterbank, normalize
from emarule.speech.model import CAPE, CTCTransformer
from emarule.speech.specaugment import SpecAugment

# torchaudio.transforms.MelSpectrogram(sample_rate=16000, n_fft=400, win_length=400, hop_length=160,
# n_mels=80) of the signal below, log(power + 1e-6), at (mel, frame): computed once with torchaudio 2.11.
TORCHAUDIO_LOG_MEL = [(14, 25, 6.0221), (15, 25, 6.4839), (52, 25, 4.2885), (53, 25, 4.3456), (76, 25, 0.2947),
                      (10, 0, 3.47381), (46, 0, -1.75032), (12, 25, -13.81551)]


def three_tones() -> torch.Tensor:
    n = torch.arange(8000, dtype=torch.float64)
    return (0.3 * torch.sin(2 * math.pi * 440 * n / 16000) + 0.1 * torch.sin(2 * math.pi * 3000 * n / 16000)
            + 0.01 * torch.cos(2 * math.pi * 7000 * n / 16000)).float()


def test_log_mel_matches_torchaudio_reference_values():
    lm = LogMel(16000, 80, 25, 10)
    assert (lm.win, lm.hop) == (400, 160)
    mel = torch.log(lm.power_mel(three_tones()) + 1e-6)
    assert mel.shape == (80, 51) and lm.frames(8000) == 51
    for m, f, want in TORCHAUDIO_LOG_MEL:
        assert mel[m, f].item() == pytest.approx(want, abs=2e-3), (m, f)


def test_log_mel_against_torchaudio_when_installed():
    ta = pytest.importorskip("torchaudio")
    ref = ta.transforms.MelSpectrogram(sample_rate=16000, n_fft=400, win_length=400, hop_length=160, n_mels=80)
    x = torch.randn(12345, generator=torch.Generator().manual_seed(3))
    assert torch.allclose(LogMel().power_mel(x), ref(x), rtol=1e-4, atol=1e-5)


def test_mel_filterbank_peaks_in_order_and_features_normalized():
    fb = mel_filterbank(201, 80, 16000)
    assert fb.shape == (201, 80) and (fb >= 0).all() and fb.max() <= 1.0 + 1e-6
    peaks = fb.argmax(0)
    assert (peaks[1:] >= peaks[:-1]).all()
    # a 1 kHz tone lands in the filter whose peak is nearest 1 kHz
    t = torch.arange(16000) / 16000
    feats = LogMel()(torch.sin(2 * math.pi * 1000 * t))
    assert feats.shape == (101, 80)
    assert feats.mean().item() == pytest.approx(0.0, abs=1e-5) and feats.std().item() == pytest.approx(1.0, abs=1e-3)
    centre = (fb.argmax(0).float() * 40.0 - 1000).abs().argmin()
    assert abs(int(feats[50].argmax()) - int(centre)) <= 1
    x = torch.randn(7, 5) * 3 + 2
    assert normalize(x).mean().abs() < 1e-5


def test_specaugment_masks_widths_counts_and_determinism():
    sa = SpecAugment(freq_masks=2, freq_param=30, time_masks=10, time_param=50, time_ratio=0.1)
    ones = torch.ones(300, 80)
    a = sa(ones, 200, torch.Generator().manual_seed(1))
    b = sa(ones, 200, torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and not torch.equal(a, sa(ones, 200, torch.Generator().manual_seed(2)))
    assert (a[200:] == 1).all()  # padding frames are never masked
    for seed in range(20):
        m = sa(ones, 200, torch.Generator().manual_seed(seed))[:200]
        full_cols = (m == 0).all(0).sum().item()
        assert full_cols <= 2 * 30  # at most two frequency masks of width ≤ F
        masked_rows = (m == 0).all(1).sum().item()
        assert masked_rows <= 10 * min(50, int(0.1 * 200))  # ten time masks of width ≤ min(T, p·frames)
    assert torch.equal(SpecAugment(0, 30, 0, 50, 0.1)(ones, 200, torch.Generator()), ones)


def test_tokens_encode_decode_and_hard_transcription():
    assert tokens.VOCAB == 29 and tokens.SYMBOLS[tokens.BLANK] == "<blank>"
    ids = tokens.encode("DON'T stop")
    assert tokens.decode(ids) == "don't stop" and ids.count(tokens.SYMBOLS.index("|")) == 1
    with pytest.raises(ValueError, match="not in the token set"):
        tokens.encode("r2d2")
    h, e, l_, o = (tokens.SYMBOLS.index(c) for c in "helo")
    b = tokens.BLANK
    frames = [h, b, b, e, e, l_, l_, l_, b, b, l_, l_, b, b, b, o, o]  # the paper's "h##eelll##ll###oo"
    assert tokens.decode(tokens.collapse(frames)) == "hello"
    scores = torch.full((1, len(frames), tokens.VOCAB), -9.0)
    scores[0, torch.arange(len(frames)), torch.tensor(frames)] = 0.0
    assert tokens.greedy(scores, torch.tensor([len(frames)])) == ["hello"]
    assert tokens.greedy(scores, torch.tensor([3])) == ["h"]


def test_wer_counts_are_additive():
    e, w = wer.counts(["the cat sat", "a b"], ["the cat sat", "a c d"])
    assert (e, w) == (2, 5)  # one substitution, one insertion
    e2, w2 = wer.counts(["x y z"], [""])
    assert (e2, w2) == (3, 3)
    assert wer.percent(e + e2, w + w2) == pytest.approx(100 * 5 / 8)
    assert wer.counts([], []) == (0, 0)


def test_wer_counts_the_insertions_against_an_empty_reference():
    assert wer.counts(["", "a"], ["x y z", "a"]) == (3, 1)
    assert wer.counts([" "], ["x y"]) == (2, 0) and wer.counts([""], [""]) == (0, 0)
    e, w = wer.counts(["", "a b"], ["x", "a"])  # additive: the same as the pairs counted one by one
    assert (e, w) == tuple(map(sum, zip(wer.counts([""], ["x"]), wer.counts(["a b"], ["a"]), strict=True)))


def test_cape_is_sinusoidal_in_eval_and_augmented_in_training():
    cape = CAPE(16, frame_seconds=0.03)
    cape.eval()
    lengths = torch.tensor([5, 3])
    pos = cape.positions(lengths, 5)
    assert torch.allclose(pos[0], (torch.arange(5) - 2) * 0.03)  # centred on the sequence's middle
    assert torch.allclose(pos[1, :3], (torch.arange(3) - 1) * 0.03)
    emb = cape(lengths, 5)
    assert torch.allclose(emb[0, :, 0], torch.sin(pos[0] * cape.freq[0]))
    assert torch.allclose(emb[0, :, 1], torch.cos(pos[0] * cape.freq[1]))
    cape.train()
    torch.manual_seed(0)
    aug = cape.positions(lengths, 5)
    assert not torch.allclose(aug, pos)
    steps = aug[0, 1:] - aug[0, :-1]
    assert (steps > 0).all()  # the local shift keeps positions in order
    assert (steps / 0.03).min() > 0 and (steps / 0.03).max() < 2 * 1.1


def test_model_shapes_lengths_and_dropout_switch():
    torch.manual_seed(0)
    m = CTCTransformer(80, 29, dim=32, layers=2, heads=2, mlp_dim=64, dropout=0.3, layer_drop=0.3)
    frames = torch.tensor([100, 61])
    assert m.out_lengths(frames).tolist() == [34, 21]  # ⌈frames / 3⌉ with padding 3 and kernel 7
    m.eval()
    lp, lengths = m(torch.randn(2, 100, 80), frames)
    assert lp.shape == (2, 34, 29) and lengths.tolist() == [34, 21]
    assert torch.allclose(lp.exp().sum(-1), torch.ones(2, 34), atol=1e-5)
    m.set_dropout(0.1, 0.1)
    assert m.layer_drop == 0.1 and all(d.p == 0.1 for d in m.modules() if isinstance(d, torch.nn.Dropout))
    # attention's dropout is a float on MultiheadAttention, not an nn.Dropout module
    assert [layer.self_attn.dropout for layer in m.layers] == [0.1, 0.1]
    assert m.layers[0].norm_first is False  # post-LayerNorm


def test_padding_does_not_change_an_utterance_in_eval():
    torch.manual_seed(1)
    m = CTCTransformer(80, 29, dim=32, layers=2, heads=2, mlp_dim=64, dropout=0.0, layer_drop=0.0).eval()
    x = torch.randn(1, 60, 80)
    alone, n = m(x, torch.tensor([60]))
    padded, _ = m(torch.cat([x, torch.zeros(1, 30, 80)], 1), torch.tensor([60]))  # collate pads with zeros
    assert torch.allclose(alone[0, :int(n)], padded[0, :int(n)], atol=1e-4)
