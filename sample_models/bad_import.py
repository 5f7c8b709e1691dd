"""Broken on purpose: importing this file raises (before the factory it defines is reached)."""
raise ImportError("cannot import name 'FancyBlock' from 'mylib'")


def build():   # never reached: the import fails first
    raise AssertionError("unreachable")
