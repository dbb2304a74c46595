"""``python -m attnbook.audit`` in CI: exit codes, --fail-on, --subject and --junit (issue 47)."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

import pandas as pd
import pytest

from attnbook.audit import CHECKS, MODES, OPTIONAL_CHECKS
from attnbook.audit.__main__ import exit_status, parse_args
from attnbook.audit.junit import junit_xml

MODULE = '''
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
embed, qkv = nn.Embedding(50, 8), nn.Linear(8, 24)


def masked(ids, mask):
    q, k, v = qkv(embed(ids)).chunk(3, -1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, :])


def unmasked(ids, mask):
    q, k, v = qkv(embed(ids)).chunk(3, -1)
    return F.scaled_dot_product_attention(q, k, v)


def broken(ids, mask):
    raise RuntimeError("cannot run")


not_callable = 3
'''


@pytest.fixture
def user_module(tmp_path):
    (tmp_path / "padding_models.py").write_text(MODULE)
    return tmp_path


def cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "attnbook.audit", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


SMALL = ["--vocab-size", "50", "--lengths", "7,3,12,1"]


def test_a_passing_subject_exits_0_and_a_failing_one_exits_1(user_module):
    good = cli("--subject", "padding_models:masked", *SMALL, cwd=user_module)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "1 subjects, 1 runs, 0 failed" in good.stdout
    assert not (user_module / "results").exists()  # --subject writes no file unless --out is given
    bad = cli("--subject", "padding_models.py:unmasked", *SMALL, cwd=user_module)
    assert bad.returncode == 1 and "differs" in bad.stdout and "ignored" in bad.stdout, bad.stdout + bad.stderr
    both = cli("--subject", "padding_models:masked", "--subject", "padding_models:unmasked", *SMALL,
               cwd=user_module)
    assert both.returncode == 1 and "2 subjects" in both.stdout
    assert cli("--subject", "padding_models:unmasked", *SMALL, "--fail-on", "none", cwd=user_module).returncode == 0


def test_a_forward_that_cannot_run_fails_the_run_and_says_why(user_module):
    done = cli("--subject", "padding_models:broken", *SMALL, cwd=user_module)
    assert done.returncode == 1 and "cannot run" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("spec, message", [
    ("padding_models", "--subject must be MODULE:NAME"),
    ("no_such_module_xyz:forward", "cannot import no_such_module_xyz"),
    ("padding_models:nothing", "has no attribute 'nothing'"),
    ("padding_models:not_callable", "must be forward"),
    ("missing_file.py:forward", "no file missing_file.py"),
])
def test_a_bad_subject_exits_2_with_a_message(user_module, spec, message):
    done = cli("--subject", spec, cwd=user_module)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_fail_on_unexplained_passes_the_registrys_known_failures(tmp_path):
    known = cli("--only", "d2l", "--seeds", "1", "--lengths", "7,3,12,1", "--out", str(tmp_path / "a.csv"),
                "--fail-on", "unexplained", cwd=tmp_path)
    assert known.returncode == 0, known.stdout + known.stderr
    assert cli("--only", "torch-sdpa", "--seeds", "1", "--lengths", "7,3,12,1", "--out", str(tmp_path / "b.csv"),
               cwd=tmp_path).returncode == 0


def test_junit_has_one_test_case_per_subject_check_and_mode(user_module):
    out = user_module / "reports" / "audit.xml"
    cli("--subject", "padding_models:unmasked", "--subject", "padding_models:masked", *SMALL, "--junit", str(out),
        cwd=user_module)
    root = ET.parse(out).getroot()
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == 2 * len([*CHECKS, *OPTIONAL_CHECKS]) * len(MODES)
    assert root.get("tests") == str(len(cases))
    failed = {(c.get("classname"), c.get("name")) for c in cases if c.find("failure") is not None}
    assert root.get("failures") == str(len(failed)) and root.find("./testsuite").get("failures") == str(len(failed))
    assert ("attnbook.audit.padding_models:unmasked", "batch_equivalence[no_grad]") in failed
    assert not any("padding_models:masked" in name for name, _ in failed)


def test_junit_aggregates_runs_and_exit_status_follows_fail_on():
    rows = [{"subject": "s", "name": "S", "library": "user", "seed": seed, "lengths": "3 1", "check": "empty_row",
             "mode": "grad", "passed": seed == 0, "max_abs_diff": 1.0, "max_rel_diff": 0.5,
             "detail": f"detail {seed}"} for seed in (0, 1, 2)]
    results = pd.DataFrame(rows)
    case = junit_xml(results).getroot().find("./testsuite/testcase")
    failure = case.find("failure")
    assert case.get("name") == "empty_row[grad]" and failure.get("message") == "detail 1"
    assert failure.text.count("\n") == 1 and "seed 2" in failure.text
    assert exit_status(results, "any") == 1 and exit_status(results, "none") == 0
    assert exit_status(results, "unexplained") == 1  # subject "s" has no known cause
    assert exit_status(results.assign(passed=True), "any") == 0


def test_help_documents_subject_junit_and_the_exit_status(capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    for needle in ("--subject MODULE:NAME", "--junit", "--fail-on", "exit status: 0 all checks passed, 1 a check "
                   "failed", "--vocab-size", "--modes"):
        assert needle in text, needle


@pytest.mark.parametrize("argv, message", [
    (["--modes", "grad,eval"], "choose from"),
    (["--optional", "nope"], "choose from"),
    (["--atol", "-1"], "--atol must be a finite number >= 0"),
    (["--fail-on", "some"], "invalid choice"),
])
def test_bad_options(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err
