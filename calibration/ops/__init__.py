"""The code the calibration scripts time, by kernel class (Triton kernels written here).

stream: empty-launch, streaming-read, L2 multi-pass read and gather kernels; gemv_wq: the
split-K weight-only dequantizing GEMV; attention: split-K flash-decode over quantized KV
caches; moe: the vLLM-style fused MoE (align, grouped GEMM, silu*mul) and the profiler marker.
Kernel names keep their leading underscore: they are the names the profiler records, which the
committed kernel traces (calibration/data/h200/**/*kernels*.csv) list.
"""
