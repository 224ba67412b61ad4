"""The element types softlight computes in, and how DLPack and user code name them."""
from ._errors import UnsupportedDTypeError

# name -> (C ABI code, DLPack (type code, bits), bytes)
DTYPES = {
    "float32": (0, (2, 32), 4),
    "float16": (1, (2, 16), 2),
    "bfloat16": (2, (4, 16), 2),
    "float64": (3, (2, 64), 8),
}
BY_NAME = {name: c for name, (c, _, _) in DTYPES.items()}
NAMES = {c: name for name, c in BY_NAME.items()}
BY_DLPACK = {(*dl, 1): c for _, (c, dl, _) in DTYPES.items()}  # (code, bits, lanes) -> C ABI code
_DLPACK_KIND = {0: "int", 1: "uint", 2: "float", 3: "opaque", 4: "bfloat", 5: "complex", 6: "bool"}
SUPPORTED = ", ".join(DTYPES)


def describe_dlpack(dl):
    """A DLPack (code, bits, lanes) as a name: float32, int8, bfloat16x2, ..."""
    code, bits, lanes = dl
    return f"{_DLPACK_KIND.get(code, f'code{code}')}{bits}" + (f"x{lanes}" if lanes != 1 else "")


def normalize(dtype):
    """Accepts 'float32', numpy dtypes, torch dtypes (torch.float32) and the like."""
    if type(dtype) is str and dtype in DTYPES:
        return dtype
    name = getattr(dtype, "name", None)
    if not isinstance(name, str):
        name = getattr(dtype, "__name__", None) if isinstance(dtype, type) else None  # numpy's scalar types
    text = str(dtype if name is None else name).rsplit(".", 1)[-1]
    text = {"float": "float32", "half": "float16", "double": "float64", "bf16": "bfloat16"}.get(text, text)
    if text not in DTYPES:
        raise UnsupportedDTypeError(f"softlight: unsupported dtype {dtype!r}; supported: {SUPPORTED}")
    return text


def code(name):
    return DTYPES[name][0]


def itemsize(name):
    return DTYPES[name][2]
