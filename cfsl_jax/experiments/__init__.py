"""Experiments and reporting: sweeps and their launchers, Table 1 and figures, verification."""
