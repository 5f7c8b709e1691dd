"""Shared machinery: loading a MODEL_SPEC, building inputs, devices, hooks, losses, state guards."""
