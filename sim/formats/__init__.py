"""Number formats for weights and the KV cache, as data (workloads/formats/*.yaml).

A format turns tensor shapes into bytes and work. The lowering asks a format only through
``Traffic``-returning methods, so new formats never touch the engine:

* ``weight_read(rows, cols)``: reading a [rows x cols] weight matrix once;
* ``kv_read(tokens, k_width, v_width)``: reading one sequence's cached K and V in one layer;
* ``kv_append(k_width, v_width)``: writing one new token's K and V;
* ``kv_footprint(tokens, k_width, v_width)``: bytes resident for one sequence and layer;
* ``matmul_dtype``: the dtype the matrix unit consumes after dequantization.

``spec`` is the YAML schema, ``base`` the exact accounting, ``reference`` the numpy
quantizer/dequantizer of every format and ``fidelity`` the error measurements on KV tensors.
"""

from sim.formats.base import Format, TensorBytes, Traffic, build_format, get_format, list_formats

__all__ = ["Format", "TensorBytes", "Traffic", "build_format", "get_format", "list_formats"]
