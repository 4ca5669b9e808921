"""A stand-in for torch and triton, so the calibration scripts' sweep code runs without them.

The sweep-equivalence test expands each script's sweep by calling the script's own
configuration builders; those create a few tensors on the way (pools, index buffers) that the
expansion never reads. This stub answers every such call with an inert value, and gives dtypes
their real element sizes, which the configuration ids depend on. Nothing here times anything.
"""
from __future__ import annotations

import contextlib
import sys
import types
from types import SimpleNamespace


class Inert:
    """Absorbs any call, attribute, index, arithmetic or iteration; counts as 1 and as true."""

    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        return Inert()

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Inert()

    def __getitem__(self, k):
        return Inert()

    def __setitem__(self, k, v):
        pass

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0

    def __int__(self):
        return 1

    def __index__(self):
        return 1

    def __float__(self):
        return 1.0

    def __bool__(self):
        return True

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def _op(self, *a):
        return Inert()

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _op
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __pow__ = _op
    __neg__ = __and__ = __or__ = __rshift__ = __lshift__ = __matmul__ = _op
    __lt__ = __le__ = __gt__ = __ge__ = _op


class DType:
    """A dtype with its element size, named as torch prints it."""

    def __init__(self, name: str, size: int):
        self.name, self.size = name, size

    def __repr__(self):
        return f"torch.{self.name}"


DTYPES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float64": 8, "double": 8,
          "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1, "uint8": 1, "int16": 2, "int32": 4,
          "int64": 8, "long": 8, "bool": 1}


class StubModule(types.ModuleType):
    """A module whose unknown attributes are inert."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Inert()


def _empty(*shape, dtype=None, **k):
    """torch.empty: inert, but element_size() answers from the dtype."""
    t = Inert()
    t.element_size = lambda: (dtype.size if isinstance(dtype, DType) else 2)
    return t


def install() -> None:
    """Puts the stub modules into sys.modules (torch, its submodules used by the scripts, triton absent)."""
    torch = StubModule("torch")
    for name, size in DTYPES.items():
        setattr(torch, name, DType(name, size))
    torch.empty = _empty
    torch.device = lambda *a, **k: SimpleNamespace(type=a[0] if a else "cpu")
    props = SimpleNamespace(multi_processor_count=132, L2_cache_size=60 * 2**20, total_memory=141 * 10**9,
                            name="stub", major=9, minor=0)
    torch.cuda = StubModule("torch.cuda")
    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_properties = lambda *a: props
    torch._grouped_mm = Inert()
    torch.__version__ = "0+stub"
    mods = {"torch": torch, "torch.cuda": torch.cuda}
    for sub in ("nn", "nn.functional", "nn.attention", "profiler", "distributed", "multiprocessing",
                "utils", "utils.cpp_extension"):
        mods[f"torch.{sub}"] = StubModule(f"torch.{sub}")
    torch.nn = mods["torch.nn"]
    torch.nn.functional = mods["torch.nn.functional"]
    torch.nn.attention = mods["torch.nn.attention"]
    torch.profiler = mods["torch.profiler"]
    torch.distributed = mods["torch.distributed"]
    torch.multiprocessing = mods["torch.multiprocessing"]
    for name, mod in mods.items():
        sys.modules[name] = mod
    triton = StubModule("triton")
    triton.jit = _jit
    triton.language = StubModule("triton.language")
    triton.language.constexpr = int
    sys.modules["triton"] = triton
    sys.modules["triton.language"] = triton.language
    for sub in ("backends", "backends.compiler", "backends.nvidia", "backends.nvidia.compiler", "compiler",
                "runtime", "runtime.driver"):
        sys.modules[f"triton.{sub}"] = StubModule(f"triton.{sub}")


def _jit(fn=None, **k):
    """triton.jit as a no-op decorator (with or without arguments)."""
    return fn if fn is not None else (lambda f: f)


@contextlib.contextmanager
def installed(*script_dirs: str):
    """The stub in sys.modules (and script_dirs on sys.path) for the duration; every module imported
    meanwhile is dropped afterwards, so the stub and the scripts leak into no other test."""
    before_modules, before_path = set(sys.modules), list(sys.path)
    install()
    sys.path[:0] = list(script_dirs)
    try:
        yield
    finally:
        for name in set(sys.modules) - before_modules:
            del sys.modules[name]
        sys.path[:] = before_path
