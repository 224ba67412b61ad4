"""The element types softlight computes in, and how DLPack and user code name them."""
from ._errors import UnsupportedDTypeError

# name -> (C ABI code, DLPack (type code, bits), bytes)
DTYPES = {
    "float32": (0, (2, 32), 4),
    "float16": (1, (2, 16), 2),
    "bfloat16": (2, (4, 16), 2),
    "float64": (3, (2, 64), 8),
}
_BY_DLPACK = {dl: name for name, (_, dl, _) in DTYPES.items()}
_DLPACK_KIND = {0: "int", 1: "uint", 2: "float", 3: "opaque", 4: "bfloat", 5: "complex", 6: "bool"}
SUPPORTED = ", ".join(DTYPES)


def from_dlpack(code, bits, lanes):
    """The dtype name for a DLPack data type, or UnsupportedDTypeError naming it."""
    name = _BY_DLPACK.get((code, bits)) if lanes == 1 else None
    if name is None:
        kind = _DLPACK_KIND.get(code, f"code{code}")
        shown = f"{kind}{bits}" + (f"x{lanes}" if lanes != 1 else "")
        raise UnsupportedDTypeError(f"softlight: unsupported dtype {shown}; supported: {SUPPORTED}")
    return name


def normalize(dtype):
    """Accepts 'float32', numpy dtypes, torch dtypes (torch.float32) and the like."""
    if type(dtype) is str and dtype in DTYPES:
        return dtype
    text = str(getattr(dtype, "name", dtype)).rsplit(".", 1)[-1]
    text = {"float": "float32", "half": "float16", "double": "float64", "bf16": "bfloat16"}.get(text, text)
    if text not in DTYPES:
        raise UnsupportedDTypeError(f"softlight: unsupported dtype {dtype!r}; supported: {SUPPORTED}")
    return text


def code(name):
    return DTYPES[name][0]


def itemsize(name):
    return DTYPES[name][2]
