"""torchdiag: diagnostics for PyTorch models from the command line and from Python.

    import torchdiag
    result = torchdiag.summary(model, torch.randn(8, 3, 32, 32))

Every function returns the Result the CLI renders (`.data`, `.tables`, `.findings`, `.to_dict()`).
`import torchdiag` stays light: torch is imported only when a diagnostic runs."""
__version__ = "0.1.0"

from .api import (  # noqa: E402  (stdlib-only module; heavy imports happen inside each function)
    activations, as_inputs, attention, doctor, embeddings, flops, gradcam, gradcheck, gradflow, make_loss, memory,
    nancheck, overfit_batch, profile, summary,
)
from .errors import DiagError, ExitCode, ModelError, UsageError  # noqa: E402
from .results import Finding, Result, Table  # noqa: E402
