"""torchdiag: diagnostics for PyTorch models from the command line (and Python).

`import torchdiag` stays light: torch is imported only when a diagnostic runs."""
__version__ = "0.1.0"
