"""Issue 26: a finding on a healthy zoo model stays only as a listed exception, true of that model, with its reason
(bench/README's exceptions table). bench/corpus_summary.unlisted names the stored rows the table does not."""
from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import corpus_summary  # noqa: E402

TABLE = ("#### Exceptions: findings kept because they are true of the model\n\n| model | finding | why |\n|---|---|---|\n"
         "| hf levit, clip | gradflow: `exploding-grad` | measured |\n\n#### The next section\n"
         "| hf vit_mae | doctor: `exploding-grad` | not the table |\n")


def _row(model, **command):
    return {"model": model, "commands": [dict({"command": "gradflow", "exit": 0, "errors": [], "warnings": []},
                                              **command)]}


def test_a_row_with_a_finding_is_unlisted_unless_the_table_names_it():
    error = [{"code": "exploding-grad", "severity": "error"}]
    rows = [_row("zoo_hf_levit", exit=1, errors=error), _row("zoo_hf_clip", exit=1, errors=error),
            _row("zoo_hf_vit_mae", exit=1, errors=error),       # named only below the table
            _row("zoo_hf_chinese_clip", exit=0, warnings=error),  # "clip" inside another name is not its name
            _row("zoo_tv_resnet18", exit=3),                      # a failed exit counts as a finding
            _row("zoo_hf_bert")]                                  # clean: nothing to list
    assert corpus_summary.unlisted(rows, TABLE) == ["zoo_hf_vit_mae", "zoo_hf_chinese_clip", "zoo_tv_resnet18"]


def test_a_listed_model_with_another_finding_is_unlisted():
    """A zoo re-run: hf swiftformer gained a batchnorm-batch-1 warning and passed, listed for another finding."""
    error, warning = [{"code": "exploding-grad", "severity": "error"}], [{"code": "batchnorm-batch-1"}]
    rows = [_row("zoo_hf_levit", exit=1, errors=error, warnings=warning), _row("zoo_hf_clip", exit=1, errors=error)]
    assert corpus_summary.unlisted(rows, TABLE) == ["zoo_hf_levit"]


def test_skipped_commands_are_not_findings():
    rows = [{"model": "zoo_tv_vit_h_14", "commands": [{"command": "gradflow", "skipped": "over the size budget"}]}]
    assert corpus_summary.unlisted(rows, TABLE) == []


def test_every_stored_zoo_row_with_a_finding_is_a_listed_exception():
    results = json.loads((BENCH / "corpus-zoo-results.json").read_text(encoding="utf-8"))
    readme = (BENCH / "README.md").read_text(encoding="utf-8")
    assert corpus_summary.EXCEPTIONS in readme
    assert corpus_summary.unlisted(results, readme) == []
