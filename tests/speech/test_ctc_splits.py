"""A split has one role in a CTC run: the training split evaluated would score training data as a test set
(and in the generated corpus take the evaluation splits' size), so naming a split twice is refused."""

import pytest

from cli_util import invoke, one_line_error
from emarule.errors import UserError
from emarule.tasks.ctc import distinct_splits


def test_the_training_split_among_the_evaluation_splits_is_refused_before_anything_is_built(tmp_path):
    res = invoke("run", "ctc-polyak", "--preset", "tiny", "--set", "data.eval_splits=[train-clean-100]",
                 "--set", f"corpus.dir={tmp_path / 'corpus'}", "--out", tmp_path / "run")
    one_line_error(res, "'train-clean-100'", "data.labeled and data.eval_splits", "remove it from data.eval_splits")
    assert not (tmp_path / "corpus").exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize("unlabeled, evals, words", [
    (["train-clean-100"], ["dev-clean"], "data.labeled and data.unlabeled"),
    (["train-clean-360"], ["train-clean-360"], "data.unlabeled and data.eval_splits"),
    (["train-clean-360", "train-clean-360"], ["dev-clean"], "twice (data.unlabeled)"),
    ([], ["dev-clean", "dev-clean"], "twice (data.eval_splits)"),
])
def test_a_split_named_twice_is_refused(unlabeled, evals, words):
    with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")):
        distinct_splits("train-clean-100", unlabeled, evals)


def test_distinct_splits_pass():
    distinct_splits("train-clean-100", ["train-clean-360", "train-other-500"], ["dev-clean", "test-clean"])
