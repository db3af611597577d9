"""Job configs: strict YAML into frozen dataclasses (pure: no I/O beyond reading the files it is
given, no torch).
"""
