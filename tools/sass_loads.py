"""The order of a kernel's first global loads in its SASS, and whether a load is waited on before
the 16-byte loads after it issue (docs/design.md, "A peeled row's edges over lanes": ptxas put a
peeled row's edge element load above the packs' loads, then used its register before the last
packs' loads issued, so the warp waited a whole load before loading the rest of its row; the short
rows' backward summed each pack before loading the next).

    nvcc -std=c++17 -O3 -arch=sm_90a -Iinclude -Isrc -cubin -o wr.cubin src/warp_rows.cu
    cuobjdump -sass wr.cubin > wr.sass
    python tools/sass_loads.py wr.sass rows_in_registers_kernel

For each function whose name holds the given part, up to its first CTA barrier or shuffle: the global
loads in order (P a 16-byte load, E a narrower one), then each load whose registers an instruction
touches before a 16-byte load that comes after it issues ("waits").
"""
import importlib.util
import re
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location("sass_loops", Path(__file__).with_name("sass_loops.py"))
_loops = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_loops)
functions, opcode = _loops.functions, _loops.opcode

STOP = ("BAR.SYNC", "BAR.RED", "SHFL.")


def registers(instruction):
    """The R registers an instruction touches (its destination among them), as numbers: a 64-bit
    address Rn.64 is Rn and Rn+1, a 16-byte load's destination four registers."""
    regs = set()
    for r, wide in re.findall(r"\bR(\d+)(\.64)?\b", instruction):
        regs.update(range(int(r), int(r) + (2 if wide else 1)))
    dest = re.search(r"LD\S*\.128\s+R(\d+)", instruction)
    if dest:
        regs.update(range(int(dest.group(1)), int(dest.group(1)) + 4))
    return regs


def head(code):
    """The instructions before the first CTA barrier or shuffle (the start of a reduction)."""
    for i, (_, ins) in enumerate(code):
        if opcode(ins).startswith(STOP):
            return code[:i]
    return code


def loads(code):
    """(address, 'P' or 'E', destination register) of each global load in `code`."""
    out = []
    for a, ins in code:
        op = opcode(ins)
        if op.startswith("LDG"):
            dest = re.search(r"LDG\S*\s+R(\d+)", ins)
            out.append((a, "P" if ".128" in op else "E", int(dest.group(1)) if dest else -1))
    return out


def waits(code):
    """(load address, its kind, address of the instruction that touches its registers, 16-byte loads
    from there on) for each load whose registers are used (or loaded again) before a 16-byte load
    that follows it issues."""
    found = []
    order = loads(code)
    for k, (a, kind, reg) in enumerate(order):
        later = [b for b, w, _ in order[k + 1:] if w == "P"]
        if not later or reg < 0:
            continue
        mine = set(range(reg, reg + (4 if kind == "P" else 1)))
        for b, ins in code:
            if a < b <= later[-1] and mine & registers(ins):
                found.append((a, kind, b, sum(x >= b for x in later)))
                break
    return found


def main(path, name_part):
    lines = open(path).read().split("\n")
    for name, code in functions(lines):
        if name_part not in name:
            continue
        first = head(code)
        order = "".join(kind for _, kind, _ in loads(first))
        late = waits(first)
        note = "; ".join(f"{k} at {a:04x} used at {b:04x}, {n} P after" for a, k, b, n in late) or "no wait"
        print(f"{order or '-':24s} {note}  {name}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")
