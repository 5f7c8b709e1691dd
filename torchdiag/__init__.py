"""torchdiag: diagnostics for PyTorch models from the command line and from Python.

    import torchdiag
    result = torchdiag.summary(model, torch.randn(8, 3, 32, 32))

Every function returns the Result the CLI renders (`.data`, `.tables`, `.findings`, `.to_dict()`).
`import torchdiag` stays light: names are loaded on first use (PEP 562), and torch only when a
diagnostic runs, so `torchdiag --help` pays for neither."""
__version__ = "0.1.0"

from .commands import COMMANDS as _COMMANDS

# the Python function of every command the registry gives one, and the helpers
_API = (*sorted(c.python for c in _COMMANDS if c.python), "as_inputs", "make_loss", "run")
_API += ("watch_callback",)   # watch inside a Hugging Face or Lightning trainer (api.watch_callback)
_ERRORS = ("DiagError", "ExitCode", "ModelError", "UsageError", "OptionError")
_RESULTS = ("Finding", "Result", "Table")
_SUBMODULES = ("api", "commands", "errors", "results", "testing", "core", "diagnostics", "render", "runner", "cli")
__all__ = [*_API, *_ERRORS, *_RESULTS, "__version__"]


def __getattr__(name: str):
    import importlib

    if name in _SUBMODULES:   # `import torchdiag; torchdiag.api.run(...)`
        return importlib.import_module(f"{__name__}.{name}")
    for module, names in (("api", _API), ("errors", _ERRORS), ("results", _RESULTS)):
        if name in names:
            return getattr(importlib.import_module(f"{__name__}.{module}"), name)
    raise AttributeError(f"module 'torchdiag' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
