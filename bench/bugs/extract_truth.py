"""Write ground_truth.json from DeepFD's Benchmark/Evaluation.xlsx (stdlib only: an .xlsx is zipped XML).

    git --git-dir=<DeepFD mirror> show HEAD:Benchmark/Evaluation.xlsx > /tmp/Evaluation.xlsx
    python bench/bugs/extract_truth.py /tmp/Evaluation.xlsx <commit>

Sheet 'Diagnosis': per program its source, post id, ground-truth fault types (column D), each tool's report
(E-H), detection (I-L: 1/0) and fault-type diagnosis (M-P: 1/0) for UMLAUT, AutoTrainer, DeepLocalize, DeepFD.
"""
from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

NS = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
TOOLS = ["UMLAUT", "AutoTrainer", "DeepLocalize", "DeepFD"]


def sheet_rows(path: str, index: int = 1) -> list[dict[str, str | None]]:
    z = zipfile.ZipFile(path)
    strings = [''.join(t.text or '' for t in si.iter(NS + 't'))
               for si in ET.fromstring(z.read('xl/sharedStrings.xml')).findall(NS + 'si')]
    rows = []
    for r in ET.fromstring(z.read(f'xl/worksheets/sheet{index}.xml')).iter(NS + 'row'):
        row: dict[str, str | None] = {}
        for c in r.findall(NS + 'c'):
            col = re.match(r'[A-Z]+', c.get('r', '')).group()  # type: ignore[union-attr]
            v = c.find(NS + 'v')
            row[col] = None if v is None else (strings[int(v.text)] if c.get('t') == 's' else v.text)
        rows.append(row)
    return rows


def main(path: str, commit: str) -> None:
    programs = []
    for r in sheet_rows(path)[2:]:
        if not (r.get('A') and r.get('C') and r.get('D')):
            continue
        programs.append({
            "no": int(r['A']), "source": r['B'], "post": r['C'],
            "ground_truth": [s.strip() for s in (r['D'] or '').split(',')],
            "detected": {t: int(r[c] or 0) for t, c in zip(TOOLS, 'IJKL')},
            "diagnosed": {t: int(r[c] or 0) for t, c in zip(TOOLS, 'MNOP')},
            "reported": {t: r.get(c) for t, c in zip(TOOLS, 'EFGH')},
        })
    out = {"source": {"repo": "ArabelaTso/DeepFD", "path": "Benchmark/Evaluation.xlsx", "commit": commit,
                      "sheet": "Diagnosis"}, "programs": programs}
    dest = Path(__file__).with_name("ground_truth.json")
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(programs)} programs -> {dest}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
