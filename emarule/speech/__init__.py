"""Speech recognition parts for the CTC experiments (§3.2, §3.3, App. G).

tokens (letters, word boundary, blank; greedy CTC decoding), features (80 log-mel filterbanks),
specaugment, model (conv front end + post-LN transformer with CAPE positions), wer (jiwer),
librispeech (the loader for LibriSpeech's layout) and corpus (a generated speech corpus written
in that layout, the `cpu` and `tiny` presets' data).
"""
