"""kernels.py's sections, one module per kernel class: which configurations each runs (their
shapes come from calibration/sweeps/kernels.yaml) and the PyTorch code each times (the Triton
kernels are in calibration/ops/). bench.py holds the runner they share."""
