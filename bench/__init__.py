"""The proxy benchmark: yard side by side with direct access to the same
upstream. ``make bench`` (or ``python -m bench``) runs it; see
:mod:`bench.__main__`."""
