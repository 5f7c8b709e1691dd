"""The run contract: torch-free Options validated before loading, one meta refusal, options named in the
caller's terms, layers that import one way, diagnostics that return data only, one registry of commands."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from support import ROOT, sample

COMMANDS = ["summary", "flops", "nancheck", "gradflow", "overfit-batch", "lr-find", "profile", "memory", "doctor",
            "watch", "activations", "gradcam", "attention", "embeddings", "gradcheck", "data"]   # every command with a diagnostic
REQUIRED = {"gradcam": {"layer": "x", "image": str(ROOT / "docs/images/sample_input.png")}, "embeddings": {"layer": "x"}}
PACKAGE = ROOT / "torchdiag"


@pytest.mark.slow
@pytest.mark.subprocess
def test_every_options_is_built_and_validated_without_torch():
    code = f"""
import sys
from torchdiag.diagnostics import module
for command in {COMMANDS!r}:
    module(command).Options(**{REQUIRED!r}.get(command, {{}}))
print(sorted(m for m in ("torch", "numpy", "torchinfo", "fvcore", "tensorboard") if m in sys.modules))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout


def _modules(folder: Path):
    for path in sorted(folder.rglob("*.py")):
        yield path, ast.parse(path.read_text(), filename=str(path))


def _imported(tree) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


BELOW_CLI = ["core", "diagnostics", "render", "runner", "api.py", "commands.py", "errors.py", "results.py",
             "testing.py", "__init__.py"]


def _files(layer: str):
    path = PACKAGE / layer
    if path.is_dir():
        yield from _modules(path)
    else:
        yield path, ast.parse(path.read_text(), filename=str(path))


@pytest.mark.parametrize("layer", BELOW_CLI)
def test_nothing_below_cli_imports_cli(layer):
    def is_cli(name: str) -> bool:   # relative (..cli, .cli.x, from .. import cli) or absolute
        return name.lstrip(".") == "cli" or name.lstrip(".").startswith("cli.") or name.endswith(".cli") or \
            ".cli." in name or name.startswith("torchdiag.cli")

    offenders = [f"{path.relative_to(ROOT)}: {name}" for path, tree in _files(layer)
                 for name in _imported(tree) | _from_names(tree) if is_cli(name)]
    assert not offenders, offenders


def _from_names(tree) -> set[str]:
    """`from .. import cli` imports the module cli: its name, as `..cli`."""
    return {"." * node.level + (node.module + "." if node.module else "") + a.name
            for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level for a in node.names}


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _private_uses(path: Path, tree) -> list[str]:
    """Private names (`_name`) one of our modules takes from another: imported by name, or read as an
    attribute of a module imported from torchdiag (`from . import common as c; c._report`)."""
    found, aliases = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("torchdiag")):
            parts = (node.module or "").split(".")
            found += [f"module {node.module}" for p in parts if p.startswith("_") and not _dunder(p)]
            found += [a.name for a in node.names if a.name.startswith("_") and not _dunder(a.name)]
            aliases |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            aliases |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.startswith("torchdiag")}
    found += [f"{node.value.id}.{node.attr}" for node in ast.walk(tree)
              if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
              and node.attr.startswith("_") and not _dunder(node.attr)]
    return [f"{path.relative_to(ROOT)}: {name}" for name in found]


# Known, in core/ and diagnostics/ (the other half of the same clean-up removes them): listed so that a new
# one fails this test, and so that each one removed must leave this list too.
PRIVATE_KNOWN = {"torchdiag/core/loss.py: _normalise", "torchdiag/diagnostics/doctor/shared.py: _collect",
                 "torchdiag/diagnostics/nancheck/scaled.py: _bad_update"}


def test_no_module_takes_another_modules_private_names():
    found = {use for path, tree in _modules(PACKAGE) for use in _private_uses(path, tree)}
    assert found == PRIVATE_KNOWN, sorted(found ^ PRIVATE_KNOWN)


def test_cli_has_no_import_cycle():
    """cli/ modules import one way (app -> a command's module -> common), at any depth of the file."""
    names = {path.stem for path in (PACKAGE / "cli").glob("*.py")}
    graph = {}
    for path, tree in _modules(PACKAGE / "cli"):
        targets = {n.lstrip(".").split(".")[0] for n in _imported(tree) | _from_names(tree)
                   if n.startswith(".") and not n.startswith("..")}
        graph[path.stem] = targets & names - {path.stem}

    def cycle_from(start, node, seen):
        for nxt in graph[node]:
            if nxt == start:
                return [*seen, nxt]
            if nxt not in seen:
                found = cycle_from(start, nxt, [*seen, nxt])
                if found:
                    return found
        return None

    cycles = [c for name in graph if (c := cycle_from(name, name, [name]))]
    assert not cycles, cycles


def test_the_registry_is_the_one_list_of_commands():
    """commands.py declares each command; the Typer app, the Python API, the CLI modules, the diagnostics,
    the renderers' writers and the runner's per-rank set all come from it, and nothing is left over."""
    from typer.main import get_command

    import torchdiag
    from torchdiag import api
    from torchdiag.cli.app import COMMANDS as CLI
    from torchdiag.cli.app import SUMMARIES, app
    from torchdiag.commands import COMMANDS as REGISTRY
    from torchdiag.commands import NAMES

    assert CLI == list(NAMES) and list(get_command(app).commands) == list(NAMES)
    assert SUMMARIES == {c.name: c.summary for c in REGISTRY}
    assert [c for c in COMMANDS] == [c.name for c in REGISTRY if c.diagnostic]     # this file's own list, checked
    python = {c.python for c in REGISTRY if c.python}
    helpers = {"as_inputs", "make_loss", "run", "watch_callback"}
    assert python == set(torchdiag._API) - helpers == set(api.__all__) - helpers
    assert all(callable(getattr(torchdiag, name)) for name in python)
    # one module per command in cli/, diagnostics/ and render/, and no module for a command that is not declared
    cli_modules = {p.stem for p in (PACKAGE / "cli").glob("*.py")} - {"__init__", "app", "common", "progress"}
    assert cli_modules == {c.module_name for c in REGISTRY}
    diagnostics = {p.stem for p in (PACKAGE / "diagnostics").iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    assert diagnostics - {"__init__"} == {c.diagnostic for c in REGISTRY if c.diagnostic}
    for c in REGISTRY:
        module = c.renderer_module()
        declared = set(getattr(module, "WRITERS", {}).values()) if module else set()
        writers = {f for name, f in vars(module).items() if name.startswith("write_") and name != "write_rank_outputs"
                   and getattr(f, "__module__", "") == module.__name__} if module else set()
        assert declared == writers and all(k.isidentifier() for k in getattr(module, "WRITERS", {})), c.name
    renderers = {p.stem for p in (PACKAGE / "render").glob("*.py") if "\nWRITERS = " in p.read_text()}
    assert renderers == {c.renderer for c in REGISTRY if c.renderer}


def test_each_command_shows_the_run_wide_options_of_its_groups():
    """The run-wide options a command's --help lists are the ones its groups declare, spelled as RUN_OPTIONS."""
    from typer.main import get_command

    from torchdiag.cli.app import app
    from torchdiag.commands import COMMANDS as REGISTRY
    from torchdiag.commands import RUN

    group = get_command(app)
    spelled = {flag.split("/")[0]: name for name, o in RUN.items() for flag in o.flags if flag.startswith("--")}
    for c in REGISTRY:
        if c.target == "config":   # check's options override a config file: its own spellings
            continue
        shown = {spelled[o] for p in group.commands[c.name].params for o in p.opts if o in spelled}
        assert shown == set(c.options()), c.name


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_registry_and_the_runner_are_torch_free():
    code = ("import sys\nimport torchdiag.commands, torchdiag.runner.local, torchdiag.runner.ranks, torchdiag.runner.check, "
            "torchdiag.runner.outcome, torchdiag.api\n"
            "print(sorted(m for m in ('torch', 'numpy', 'typer', 'rich') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout


def test_core_imports_no_diagnostics_or_render():
    offenders = [f"{path.relative_to(ROOT)}: {name}" for path, tree in _modules(PACKAGE / "core")
                 for name in _imported(tree) if "diagnostics" in name or "render" in name]
    assert not offenders, offenders


WRITERS = {"savefig", "write_text", "write_bytes", "SummaryWriter", "atomic_write", "atomic_path", "add_embedding",
           "add_scalar", "dump"}


def test_diagnostics_write_no_files():
    """Every file is written by render/ from the Result; a diagnostic returns data (profile exports its trace
    into a private temporary folder and reads it back: that is the one open-for-write allowed, and only there)."""
    offenders = []
    for path, tree in _modules(PACKAGE / "diagnostics"):
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in WRITERS:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}()")
            if name == "open" and any(isinstance(a, ast.Constant) and isinstance(a.value, str) and set(a.value) & set("wax")
                                      for a in node.args[1:2]):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} open(..., 'w')")
    assert not offenders, offenders


NEEDS_VALUES = ["nancheck", "gradflow", "overfit-batch", "profile", "activations", "attention", "embeddings", "data"]


@pytest.mark.parametrize("command", NEEDS_VALUES)
def test_meta_is_refused_once_in_one_wording_before_the_model_is_built(cli, command, tmp_path):
    extra = ["--layer", "0", "--tb", str(tmp_path)] if command == "embeddings" else []
    r = cli(command, sample("broken_factory.py:raises"), "--device", "meta", *extra, "--json")
    assert r.code == 2, r.stderr            # the factory raises: exit 3 had the model been built
    assert r.stderr.startswith(f"error: {command} needs real values; the meta device has none\n"), r.stderr
    assert r.json["exit_code"] == 2


def test_an_option_is_named_in_each_callers_terms(cli, tmp_path):
    """The same rule, written once in overfit-batch's Options: --target-ratio on the command line,
    target_ratio in Python, target-ratio in pyproject.toml; always before any model is loaded."""
    import torch
    from torch import nn

    import torchdiag
    from torchdiag.errors import OptionError

    r = cli("overfit-batch", sample("broken_factory.py:raises"), "--target-ratio", "1.5")
    assert r.code == 2 and r.stderr.startswith("error: --target-ratio: must be between 0 and 1, got 1.5"), r.stderr
    with pytest.raises(OptionError, match=r"^target_ratio: must be between 0 and 1, got 1.5"):
        torchdiag.overfit_batch(nn.Linear(2, 2), torch.randn(2, 2), target_ratio=1.5)
    (tmp_path / "c.toml").write_text(f'model = "{sample("broken_factory.py:raises")}"\n'
                                     "[check]\noverfit-batch = {target-ratio = 1.5}\n")
    r = cli("check", "--config", str(tmp_path / "c.toml"))
    assert r.code == 2 and "overfit-batch target-ratio: must be between 0 and 1, got 1.5" in r.stderr, r.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_json_error_document_has_the_schema_version_of_results():
    from torchdiag.results import SCHEMA_VERSION

    r = subprocess.run([sys.executable, "-m", "torchdiag", "summary", "nope.py:build", "--json"], capture_output=True,
                       text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 2
    assert json.loads(r.stdout)["schema_version"] == SCHEMA_VERSION


@pytest.mark.parametrize("field,value,hint", [("dtype", "half", "did you mean float16?"), ("dtype", "bf16", "did you mean bfloat16?"),
                                              ("amp", "float16", "did you mean fp16?"), ("dtype", "xyz", None)])
def test_a_refused_choice_suggests_what_was_meant(field, value, hint):
    from torchdiag.core.run import RunSpec
    from torchdiag.errors import OptionError

    with pytest.raises(OptionError) as exc:
        RunSpec("nancheck", **{field: value})
    assert exc.value.hint == hint and f"'{value}' is not one of" in exc.value.message


def _absolute(path: Path, node) -> list[str]:
    """The absolute module names an import statement in `path` (a module of the torchdiag package) names:
    relative imports resolved; `from . import x` names the submodule x as well."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = package[:len(package) - node.level + 1] if node.level else []
    stem = ".".join(base + ([node.module] if node.module else []))
    return [stem] + [f"{stem}.{a.name}" for a in node.names]


def _diagnostic_of(module: str) -> str | None:
    """'torchdiag.diagnostics.gradflow.record' → 'gradflow'; None outside the diagnostics."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["torchdiag", "diagnostics"] and len(parts) > 2 else None


# not diagnostics: the registry (diagnostics/__init__.py) and `check`, the orchestrator that runs the others
# (DESIGN.md puts orchestrators in the runner layer)
NOT_A_DIAGNOSTIC = {"__init__", "check"}


def _diagnostic_modules():
    for path, tree in _modules(PACKAGE / "diagnostics"):
        own = path.relative_to(PACKAGE / "diagnostics").with_suffix("").parts[0]
        if own not in NOT_A_DIAGNOSTIC:
            yield path, tree, own


def test_no_diagnostic_imports_another():
    """What two diagnostics share lives in core/: a diagnostic imports only itself, core and the stdlib-only
    modules beside results.py."""
    offenders = []
    for path, tree, own in _diagnostic_modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in _absolute(path, node):
                    other = _diagnostic_of(name)
                    if other is not None and other != own:
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert not offenders, offenders


def test_no_diagnostic_draws():
    """A diagnostic returns data; every picture is drawn in render/: no matplotlib, no render import."""
    offenders = []
    for path, tree, _ in _diagnostic_modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in _absolute(path, node):
                    if name.split(".")[0] == "matplotlib" or name.startswith("torchdiag.render"):
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert not offenders, offenders


def test_the_import_rules_see_what_they_forbid(tmp_path):
    """The resolver behind the two rules above, on hand-written imports of a diagnostic module."""
    path = PACKAGE / "diagnostics" / "doctor" / "update.py"
    names = lambda src: _absolute(path, ast.parse(src).body[0])   # noqa: E731
    assert "torchdiag.diagnostics.overfit_batch.scaling" in names("from ..overfit_batch.scaling import stepper")
    assert "torchdiag.diagnostics.gradflow" in names("from .. import gradflow")
    assert "torchdiag.render.images" in names("from ...render.images import tile")
    assert names("import matplotlib.pyplot") == ["matplotlib.pyplot"]
    assert "torchdiag.core.rounding" in names("from ...core.rounding import CODE")
    single = PACKAGE / "diagnostics" / "flops.py"
    assert "torchdiag.diagnostics.summary" in _absolute(single, ast.parse("from .summary import CONTAINERS").body[0])
    assert _diagnostic_of("torchdiag.diagnostics.summary") == "summary" and _diagnostic_of("torchdiag.core.tracking") is None


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_shared_layers_below_the_diagnostics_need_no_torch():
    """fmt.py and pictures.py (formatting, picture geometry) are read by render/ and the diagnostics alike."""
    code = "import sys, torchdiag.fmt, torchdiag.pictures; print(sorted(m for m in ('torch', 'numpy', 'matplotlib') if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0 and r.stdout.strip() == "[]", (r.stdout, r.stderr)


def _calls(func: ast.AST) -> set[str]:
    """The dotted names a function calls (`subprocess.Popen`, `proc.send_signal`, `os.kill`)."""
    out = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Call):
            f, parts = node.func, []
            while isinstance(f, ast.Attribute):
                parts.append(f.attr)
                f = f.value
            if isinstance(f, ast.Name):
                parts.append(f.id)
            out.add(".".join(reversed(parts)))
    return out


def test_every_test_that_signals_a_child_starts_it_with_default_dispositions():
    """A test that interrupts a child starts it with support.spawn, never subprocess.Popen: started from a shell that
    ignores SIGINT (`make test &`, nohup, a job runner) the child would inherit that and never see the Ctrl-C."""
    offenders = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        for func in ast.walk(ast.parse(path.read_text())):
            if isinstance(func, ast.FunctionDef) and func.name.startswith("test_"):
                calls = _calls(func)
                signals = any(c.endswith(".send_signal") or c in ("os.kill", "os.killpg") for c in calls)
                if signals and "subprocess.Popen" in calls:
                    offenders.append(f"{path.name}::{func.name}")
    assert not offenders, offenders


LAUNCHES = ("subprocess.run", "subprocess.Popen", "subprocess.check_output", "spawn", "torchrun", "torchrun_args",
            "torchrun_many", "torchrun_started")


def test_every_test_that_starts_a_process_is_marked_slow():
    """`make test-fast` leaves out `slow`: a test that starts a child (subprocess, spawn, torchrun) says so, with
    `subprocess` or `distributed` beside `slow` (markers are strict: pyproject.toml registers them)."""
    offenders = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        for func in ast.parse(path.read_text()).body:
            if not (isinstance(func, ast.FunctionDef) and func.name.startswith("test_")):
                continue
            marks = {ast.unparse(d).split(".")[2].split("(")[0] for d in func.decorator_list
                     if ast.unparse(d).startswith("pytest.mark.")}
            if _calls(func) & set(LAUNCHES) and not ({"slow"} <= marks and marks & {"subprocess", "distributed"}):
                offenders.append(f"{path.name}::{func.name} {sorted(marks)}")
    assert not offenders, offenders
