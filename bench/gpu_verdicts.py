"""Compare bench/gpu_verdicts.sh's runs: for each (spec, command), the exit code and the warning/error codes on cuda
against the CPU's (SAME or DIFF per pair).

    python3 bench/gpu_verdicts.py OUT/z"""
import json
import os
import sys


def exit_codes(folder: str) -> dict:
    """(spec, command, device) -> the process's exit status, from rc.txt."""
    out = {}
    with open(os.path.join(folder, "rc.txt")) as f:
        for line in f:
            spec, command, device, code = line.split()
            out[(spec, command, device)] = int(code)
    return out


def verdict(folder: str, spec: str, command: str, device: str):
    """(the document's exit_code, sorted (severity, code) of its warnings and errors, or its error's message)."""
    name = f"{spec}_{command}_{device}".translate(str.maketrans(":/.", "___"))
    try:
        with open(os.path.join(folder, name + ".json")) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None, []
    found = {(x["severity"], x["code"]) for x in doc.get("findings", []) if x["severity"] in ("warning", "error")}
    if "error" in doc:
        found.add(("error", doc["error"]["message"][:120]))
    return doc.get("exit_code"), sorted(found)


def main(folder: str) -> None:
    rc = exit_codes(folder)
    for spec, command in sorted({(s, c) for s, c, _ in rc}):
        gpu, cpu = verdict(folder, spec, command, "cuda"), verdict(folder, spec, command, "cpu")
        print("SAME" if gpu == cpu else "DIFF", spec, command, "cuda:", rc.get((spec, command, "cuda")), gpu[1],
              "| cpu:", rc.get((spec, command, "cpu")), cpu[1])


if __name__ == "__main__":
    main(sys.argv[1])
