"""Output at the edges: strict JSON, an empty limits range, your own table values, a spec's batch_multiple
with a command-line ramp."""

import json

import pytest
from typer.testing import CliRunner

from emarule.cli.main import app

runner = CliRunner()


def ok(*args):
    r = runner.invoke(app, list(args))
    assert r.exit_code == 0, r.output
    return r.output


def strict(text: str):
    def refuse(name):
        raise AssertionError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_plan_json_is_strict_json():
    # a base_step schedule without total_steps: the last stage runs to the end of training, "inf"
    d = strict(ok("plan", "byol-r18", "-k", "2", "--set", "progressive={kind: step, base_step: 100}", "-f", "json"))
    assert d["stages"][-1]["end_epoch"] == "inf"
    assert strict(ok("plan", "byol-vit", "-k", "10", "-f", "json"))["hyperparameters"]["optimizer.betas"][
        "scaled"] == [0.0, 0.5]


@pytest.mark.parametrize("gap,why", [("0.00391", "the lower bound 6.949e+04 is not below kappa_max 6.238e+04"),
                                     ("0.001", "2^-8 / r ≥ 1")])
def test_limits_says_when_no_kappa_is_meaningful(gap, why):
    args = ["limits", "--momentum", "0.9999", "--batch-size", "256", "--dtype", "bfloat16", "--relative-gap", gap]
    last = ok(*args).strip().splitlines()[-1]
    assert last.startswith("meaningful: no κ is meaningful (") and why in last, last
    assert strict(ok(*args, "-f", "json"))["meaningful_kappa"] is None


def test_table_of_your_own_values_keeps_their_digits():
    lr = ok("table", "lr", "--lr", "1e-6", "--optimizer", "adam", "--format", "csv").splitlines()
    assert lr[1] == "32,3.54e-07" and all(not row.endswith(",0") for row in lr[1:])
    rho = ok("table", "momenta", "--momentum", "0.99999999", "--batch-sizes", "256,25600,256000", "--format", "csv")
    assert rho.splitlines() == ["batch_size,rho=0.99999999@B=256", "256,0.99999999", "25600,0.999999",
                                "256000,0.99999"]


def test_set_batch_multiple_shapes_a_command_line_ramp():
    d = strict(ok("plan", "byol-r18", "-k", "4", "--progressive", "smooth:10-20", "--set",
                  "progressive.batch_multiple=3", "--format", "json"))
    ramp = [s["batch_size"] for s in d["stages"]][1:-1]
    assert ramp and all(b % 3 == 0 for b in ramp), ramp
    assert d["progressive"]["batch_multiple"] == 3
