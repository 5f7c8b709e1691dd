"""CI outputs of `check`: JUnit XML (one testcase per check) and GitHub Actions annotations."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

# Characters XML 1.0 forbids (ElementTree writes them as they are, and reporters then reject the file);
# ANSI colour codes from a model's own messages go too.
_NOT_XML = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml(text) -> str:
    return _NOT_XML.sub("", str(text))



def _error_type(row) -> str:
    return "input-error" if row["figure"] == "input error" else "model-error"   # exit 2 or exit 3


def write_junit(result, path, option: str = "--junit") -> Path:
    rows = result.table("checks").rows
    suites = ET.Element("testsuites", name="torchdiag check", tests=str(len(rows)),
                        failures=str(sum(r["status"] == "FAIL" for r in rows)),
                        errors=str(sum(r["status"] == "ERROR" for r in rows)))
    by_model: dict[str, list] = {}
    for r in rows:
        by_model.setdefault(r["model"], []).append(r)
    for model, mrows in by_model.items():
        suite = ET.SubElement(suites, "testsuite", name=_xml(f"torchdiag check {model}"), tests=str(len(mrows)),
                              failures=str(sum(r["status"] == "FAIL" for r in mrows)),
                              errors=str(sum(r["status"] == "ERROR" for r in mrows)),
                              time=f"{sum(r['seconds'] for r in mrows):.3f}")
        for r in mrows:
            case = ET.SubElement(suite, "testcase", classname=_xml(f"torchdiag.{model}"), name=r["check"],
                                 time=f"{r['seconds']:.3f}")
            text = _xml(f"{r['check']}: {r['figure']} (limit {r['limit'] or '-'})")
            if r["status"] == "FAIL":
                ET.SubElement(case, "failure", message=_xml(r["message"] or "failed"), type=r["check"]).text = text
            elif r["status"] == "ERROR":
                ET.SubElement(case, "error", message=_xml(r["message"] or "error"), type=_error_type(r)).text = text
            elif r["status"] == "INTERRUPTED":  # neither passed nor failed: it did not finish
                ET.SubElement(case, "skipped", message=_xml(r["message"] or "interrupted")).text = text
            else:
                ET.SubElement(case, "system-out").text = text
    import io

    from .output import atomic_write

    buf = io.BytesIO()
    ET.ElementTree(suites).write(buf, encoding="utf-8", xml_declaration=True)
    # the old report stays whole until the new one is on disk (a full disk once left 4 KiB of broken XML)
    return atomic_write(path, buf.getvalue(), option)


def _escape(text: str) -> str:
    # GitHub workflow-command data escaping
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def github_annotations(result) -> list[str]:
    """`::error title=…::message` lines for failed checks (GitHub reads them from stdout)."""
    lines = []
    for r in result.table("checks").rows:
        if r["status"] != "PASS":
            title = _escape(f"torchdiag {r['check']} ({r['model']})").replace(",", "%2C").replace(":", "%3A")
            lines.append(f"::error title={title}::{_escape(r['message'] or r['status'])}")
    return lines
