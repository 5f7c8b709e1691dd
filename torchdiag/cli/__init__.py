"""Thin Typer layer: one file per command; imports no torch until a command runs."""
