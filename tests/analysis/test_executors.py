"""`--executor` and the Slurm job parameters: parsed and checked before anything is written, and the sbatch
files a Slurm sweep would submit, read through submitit's own mocked Slurm (no cluster)."""

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emarule.analysis import executors as E
from emarule.analysis import jobs as J
from emarule.cli.main import app
from emarule.errors import UserError

runner = CliRunner()
TINY = ["sweep", "polyak-r50", "--preset", "tiny", "--kappas", "2", "--rule", "with,without"]


@pytest.mark.parametrize("text,minutes", [("90", 90), ("24:00:00", 1440), ("2-00:00:00", 2880), ("1-12", 2160),
                                          ("1-00:30", 1470), ("5:30", 6), ("0:59:30", 60)])
def test_time_takes_slurms_forms(text, minutes):
    assert E.parse_time(text) == minutes


@pytest.mark.parametrize("text", ["", "1h", "24:00:00:00", "0", "0:30", "-5"])
def test_bad_time_is_refused(text):
    with pytest.raises(UserError, match="--time"):
        E.parse_time(text)


def test_options_override_the_yaml_file(tmp_path, monkeypatch):
    monkeypatch.setattr(E.shutil, "which", lambda name: "/usr/bin/" + name)
    f = tmp_path / "slurm.yaml"
    f.write_text("slurm_partition: a100\nslurm_qos: high\ncpus_per_task: 12\ntimeout_min: 60\nnodes: 2\n")
    ex = E.from_options("slurm", f, partition="h100", account="proj", time="2-00:00:00", gpus_per_node=4)
    assert ex.params == {**E.SLURM_DEFAULTS, "slurm_partition": "h100", "slurm_qos": "high", "cpus_per_task": 12,
                         "timeout_min": 2880, "nodes": 2, "slurm_account": "proj", "gpus_per_node": 4,
                         "tasks_per_node": 4}
    assert ex.world == (2, 4) and ex.submits and ex.poll_s == 30.0
    local = E.from_options("submitit-local", gpus_per_node=2)
    assert local.world == (1, 2) and local.params["gpus_per_node"] == 2


@pytest.mark.parametrize("yaml_text,needle", [
    ("slurm_partiton: a100\n", "unknown parameter 'slurm_partiton'"),
    ("partition: a100\n", "unknown parameter 'partition'"),
    ("nodes: two\n", "nodes must be a whole number"),
    ("timeout_min: 0\n", "timeout_min must be ≥ 1"),
    ("- slurm_partition\n", "expected a mapping"),
    ("slurm_additional_parameters: high\n", "must be a mapping"),
    ("a: [\n", "not valid YAML"),
])
def test_bad_params_file_is_one_line_and_writes_nothing(tmp_path, monkeypatch, yaml_text, needle):
    monkeypatch.setattr(E.shutil, "which", lambda name: "/usr/bin/" + name)
    f = tmp_path / "slurm.yaml"
    f.write_text(yaml_text)
    out = tmp_path / "runs"
    res = runner.invoke(app, [*TINY, "--out", str(out), "--executor", "slurm", "--slurm-params", str(f)])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and needle in lines[0], res.output
    assert not out.exists()


@pytest.mark.parametrize("args,needle", [
    (["--executor", "pbs"], "--executor 'pbs': choose one of local, slurm, submitit-local"),
    (["--partition", "a100"], "--partition applies to submitted jobs"),
    (["--no-wait"], "--no-wait applies to submitted jobs"),
    (["--executor", "slurm"], "no sbatch on this machine's PATH"),
    (["--executor", "submitit-local", "--nodes", "2"], "submitit-local runs on this machine alone"),
    (["--executor", "submitit-local", "--time", "1h"], "--time '1h'"),
])
def test_bad_executor_options_are_one_line(tmp_path, monkeypatch, args, needle):
    monkeypatch.setattr(E.shutil, "which", lambda name: None)
    res = runner.invoke(app, [*TINY, "--out", str(tmp_path / "runs"), *args])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and needle in lines[0], res.output
    assert not (tmp_path / "runs").exists()


def test_a_study_is_not_submitted(tmp_path):
    res = runner.invoke(app, ["reproduce", "parabola", "--executor", "submitit-local", "--out", str(tmp_path / "p")])
    assert res.exit_code == 2 and "drop --executor" in res.output, res.output
    assert not (tmp_path / "p").exists()


def _sbatch(root, job_id):
    return (root / "polyak-r50" / J.JOBS_DIR / job_id / f"{job_id}_submission.sh").read_text()


def test_slurm_sweep_submits_each_run_once_with_its_parameters(tmp_path):
    """submitit's mocked Slurm takes the sbatch calls and answers sacct: the jobs it would submit, read from the
    sbatch files submitit wrote, and a second command that submits nothing while they run."""
    from submitit.core.test_core import MockedSubprocess
    from submitit.slurm.slurm import SlurmJob

    root = tmp_path / "runs"
    args = [*TINY, "--out", str(root), "--executor", "slurm", "--partition", "a100", "--account", "proj",
            "--time", "2-00:00:00", "--nodes", "2", "--gpus-per-node", "4", "--no-wait",
            "--slurm-params", str(Path(__file__).resolve().parents[2] / "scripts" / "slurm_a100.yaml")]
    mock = MockedSubprocess(known_cmds=["srun", "sbatch"])
    try:
        with mock.context():
            first = runner.invoke(app, args)
            assert first.exit_code == 0, first.output
            assert mock.job_count == 15  # three runs, three jobs: 12 (the baseline), 13 and 14
            assert "3 of 3 runs not finished yet" in first.output
            base, k2 = _sbatch(root, "12"), _sbatch(root, "13")
            for line in ("--partition=a100", "--account=proj", "--time=2880", "--nodes=2", "--ntasks-per-node=4",
                         "--gpus-per-node=4", "--cpus-per-task=8", "--signal=USR2@120", "--mem=0",
                         "--job-name=emarule-tiny-k1-rule-s0"):
                assert f"#SBATCH {line}\n" in base, (line, base)
            assert "dependency" not in base and "\nexport NCCL_ASYNC_ERROR_HANDLING=1\n" in base
            # the seed's other runs wait in the queue on its baseline, and leave it if it fails
            assert "#SBATCH --dependency=afterok:12\n" in k2 and "#SBATCH --kill-on-invalid-dep=yes\n" in k2
            assert re.search(r"srun .*-m submitit\.core\._submit", k2)
            record = J.read_record(root / "polyak-r50")
            assert record["executor"] == "slurm"
            assert {n: r["job"] for n, r in record["runs"].items()} == {
                "tiny-k1-rule-s0": "12", "tiny-k2-rule-s0": "13", "tiny-k2-norule-s0": "14"}

            mock.set_job_state("12", "RUNNING")
            mock.set_job_state("13", "PENDING")
            again = runner.invoke(app, args)
            assert again.exit_code == 0, again.output
            assert mock.job_count == 15, again.output  # nothing submitted twice
            assert "tiny-k1-rule-s0: running, job 12" in again.output
            assert "tiny-k2-rule-s0: queued, job 13" in again.output
    finally:
        SlurmJob.watcher.clear()


def test_the_a100_params_file_is_read_whole():
    params = E.read_params(Path(__file__).resolve().parents[2] / "scripts" / "slurm_a100.yaml")
    assert params["gpus_per_node"] == 8 and params["slurm_signal_delay_s"] == 120 and params["slurm_mem"] == "0"


def test_submitted_jobs_are_not_launched_under_torchrun(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UserError, match="without torchrun"):
        E.from_options("submitit-local")


def test_a_missing_submitit_is_the_slurm_extra_named_in_one_line(monkeypatch):
    import sys

    from emarule.analysis.executors import require_submitit
    from emarule.errors import UserError

    monkeypatch.setitem(sys.modules, "submitit", None)  # find_spec then reports it absent
    with pytest.raises(UserError, match=r"^--executor slurm needs emarule's slurm extra \(submitit: not installed\); "
                                        r"pip install 'emarule\[slurm\]'$"):
        require_submitit("slurm")
