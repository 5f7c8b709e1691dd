"""Broken on purpose: importing this file raises."""
raise ImportError("cannot import name 'FancyBlock' from 'mylib'")
