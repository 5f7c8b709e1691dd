"""check: config from pyproject.toml / --config, thresholds, unknown keys, JUnit, annotations, exit codes."""
import xml.etree.ElementTree as ET

import pytest

from conftest import sample


def write(tmp_path, text, name="pyproject.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


CONFIG = """
[tool.torchdiag]
model = "{model}"
inputs = ["8x3x32x32"]
device = "cpu"
[tool.torchdiag.check]
max-params = {max_params}
max-gmacs = 5.0
nancheck = true
gradflow = true
overfit-batch = {{steps = 200, target-ratio = 0.05}}
"""


def test_all_pass_from_pyproject(cli, tmp_path, monkeypatch):
    write(tmp_path, CONFIG.format(model=sample("cnn.py:build"), max_params=30000))
    monkeypatch.chdir(tmp_path)
    res = cli("check", "--json", "--junit", tmp_path / "report.xml")
    assert res.code == 0, res.stderr
    doc = res.json
    assert doc["passed"] is True and doc["total"] == 5
    assert {r["check"]: r["status"] for r in doc["checks"]} == {
        "max-params": "PASS", "max-gmacs": "PASS", "nancheck": "PASS", "gradflow": "PASS", "overfit-batch": "PASS"}
    assert doc["checks"][0]["figure"] == "25,578"   # 3*16*9+16 + 16*32*9+32 + 2048*10+10
    suite = ET.parse(tmp_path / "report.xml").getroot()
    assert suite.tag == "testsuites" and suite.get("tests") == "5" and suite.get("failures") == "0"
    assert [c.get("name") for c in suite.iter("testcase")] == ["max-params", "max-gmacs", "nancheck", "gradflow", "overfit-batch"]


def test_threshold_failure_exit_1_junit_failure_and_annotations(cli, tmp_path, monkeypatch):
    write(tmp_path, CONFIG.format(model=sample("cnn.py:build"), max_params='"25k"'))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    res = cli("check", "--no-overfit-batch", "--junit", tmp_path / "r.xml")
    assert res.code == 1
    assert "FAIL" in res.stdout and "25,578 parameters > limit 25,000" in res.stdout
    assert "::error title=torchdiag max-params" in res.stdout
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "r.xml").getroot().iter("testcase")}
    assert "overfit-batch" not in cases  # switched off on the command line
    failure = cases["max-params"].find("failure")
    assert failure is not None and "25,578" in failure.get("message")


def test_command_line_overrides_file(cli, tmp_path, monkeypatch):
    write(tmp_path, CONFIG.format(model=sample("cnn.py:build"), max_params=10))
    monkeypatch.chdir(tmp_path)
    res = cli("check", "--max-params", "1M", "--no-overfit-batch", "--no-gradflow", "--no-nancheck", "--json")
    assert res.code == 0 and res.json["checks"][0]["limit"] == "1,000,000"


def test_unknown_key_is_an_error_naming_it(cli, tmp_path, monkeypatch):
    write(tmp_path, CONFIG.format(model=sample("cnn.py:build"), max_params=30000).replace("nancheck = true", "nan-check = true"))
    monkeypatch.chdir(tmp_path)
    res = cli("check")
    assert res.code == 2
    assert "unknown key 'nan-check'" in res.stderr and "did you mean 'nancheck'" in res.stderr


def test_several_models_and_config_file(cli, tmp_path):
    cfg = write(tmp_path, f"""
[tool.torchdiag.check]
nancheck = true
[[tool.torchdiag.models]]
model = "{sample('mlp.py:build')}"
check = {{max-params = 300000}}
[[tool.torchdiag.models]]
model = "{sample('broken_nan_forward.py:build')}"
""", name="ci.toml")
    res = cli("check", "--config", cfg, "--json")
    assert res.code == 1
    rows = [(r["model"].rsplit("/", 1)[-1], r["check"], r["status"]) for r in res.json["checks"]]
    assert rows == [("mlp.py:build", "max-params", "PASS"), ("mlp.py:build", "nancheck", "PASS"),
                    ("broken_nan_forward.py:build", "nancheck", "FAIL")]


def test_model_that_raises_exits_3(cli, tmp_path):
    cfg = write(tmp_path, f"""
model = "{sample('broken_shape.py:build')}"
[check]
gradflow = true
""", name="gate.toml")
    res = cli("check", "--config", cfg)
    assert res.code == 3 and "ERROR" in res.stdout


def test_spec_on_command_line_without_config(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = cli("check", sample("mlp.py:build"), "--max-params", "300000", "--gradflow")
    assert res.code == 0, res.stderr
    res = cli("check", sample("mlp.py:build"))
    assert res.code == 2 and "no checks configured" in res.stderr


def test_no_config_is_usage_error(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = cli("check")
    assert res.code == 2 and res.stderr.startswith("error: no pyproject.toml")


@pytest.mark.parametrize("line, words", [
    ('allow = 7', "must be a list of parameter globs"),
    ('nancheck = "no"', "must be true or false"),
    ('max-gmacs = "5G"', "must be a number of GMACS"),
    ('max-params = -5', "must be > 0"),
    ('overfit-batch = "yes"', "must be true, false or a table"),
])
def test_config_values_are_type_checked(cli, tmp_path, line, words):
    cfg = write(tmp_path, f'model = "{sample("mlp.py:build")}"\n[check]\n{line}\n', name="c.toml")
    res = cli("check", "--config", cfg)
    assert res.code == 2 and words in res.stderr, res.stderr


def test_allow_as_a_string_is_one_glob_not_characters(cli, tmp_path):
    cfg = write(tmp_path, f'model = "{sample("broken_detached.py:build")}"\n[check]\ngradflow = true\n'
                          'allow = "unrelated_head.*"\n', name="c.toml")
    assert cli("check", "--config", cfg).code == 1
    cfg.write_text(cfg.read_text().replace("unrelated_head.*", "context.*"))
    assert cli("check", "--config", cfg).code == 0


def test_junit_path_checked_before_running(cli, tmp_path):
    (tmp_path / "afile").write_text("")
    res = cli("check", sample("mlp.py:build"), "--max-params", "1M", "--junit", tmp_path / "afile" / "j.xml")
    assert res.code == 2 and "does not exist" in res.stderr and "PASS" not in res.stdout
    res = cli("check", sample("mlp.py:build"), "--max-params", "1M", "--junit", tmp_path)
    assert res.code == 2 and "is a directory" in res.stderr


def test_spec_on_command_line_replaces_a_model_list(cli, tmp_path, monkeypatch):
    write(tmp_path, f"""
[tool.torchdiag.check]
max-params = 1000000
[[tool.torchdiag.models]]
model = "{sample('cnn.py:build')}"
inputs = ["8x3x32x32"]
[[tool.torchdiag.models]]
model = "{sample('transformer_lm.py:build')}"
""")
    monkeypatch.chdir(tmp_path)
    res = cli("check", sample("mlp.py:build"), "--json")
    assert res.code == 0, res.stderr
    assert [r["model"].rsplit("/", 1)[-1] for r in res.json["checks"]] == ["mlp.py:build"]
