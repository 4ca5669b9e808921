"""``decodesim calibrate``: measure a GPU through PyTorch and fit a hardware profile to it.

harness.py (the measuring harness, shared with calibration/ and validation/), bench.py (the
microbenchmarks, sweeps.yaml their sizes), fit.py (the fits, numpy only), overlay.py (figures
with their sources, written into a profile). PyTorch is imported only where it measures.
"""
