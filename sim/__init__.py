"""The proving ground: the same engine and core under virtual time, with
simulated devices, backends and workloads. ``python -m sim report``."""
