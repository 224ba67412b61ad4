"""The loops of a kernel's SASS, with the instructions of each by class: where the instructions of a
step go (the hot loops are the ones with the shared-memory loads and the exps or stores).

    nvcc -std=c++17 -O3 -arch=sm_90 -Iinclude -Isrc -cubin -o cr.cubin src/cluster_rows.cu
    cuobjdump -sass cr.cubin > cr.sass
    python tools/sass_loops.py cr.sass bfloat16Li4ELb0ELb0

A loop is a backward branch and the instructions from its target to it (nested loops are listed
each on their own, the outer ones counting the inner ones' instructions once).
"""
import re
import sys

CLASSES = ["MUFU.EX2", "FFMA", "FADD", "FMNMX", "HMNMX2", "F2F", "PRMT", "SHF", "IMAD", "LDS", "STG", "SYNCS",
           "NANOSLEEP"]


def functions(lines):
    """(name, [(address, instruction)]) for each function of a cuobjdump -sass listing."""
    starts = [i for i, line in enumerate(lines) if "Function :" in line]
    for k, start in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(lines)
        code = []
        for line in lines[start:end]:
            m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
            if m:
                code.append((int(m.group(1), 16), m.group(2)))
        yield lines[start].split("Function :")[1].strip(), code


def opcode(instruction):
    words = instruction.split()
    return words[1] if words[0].startswith("@") else words[0]


def loops(code):
    """(first address, last address, opcodes) of each backward branch's loop, in code order."""
    index = {a: i for i, (a, _) in enumerate(code)}
    for i, (a, ins) in enumerate(code):
        m = re.search(r"\bBRA\s+(?:`\(\.L_x_\d+\)\s*)?(0x[0-9a-f]+)", ins)
        if m and int(m.group(1), 16) <= a and int(m.group(1), 16) in index:
            first = index[int(m.group(1), 16)]
            yield code[first][0], a, [opcode(x) for _, x in code[first:i + 1]]


def main(path, name_part):
    lines = open(path).read().split("\n")
    for name, code in functions(lines):
        if name_part not in name:
            continue
        print(f"{name}: {len(code)} instructions")
        for first, last, ops in loops(code):
            counts = " ".join(f"{c} {sum(o.startswith(c) for o in ops)}" for c in CLASSES)
            print(f"  loop {first:05x}-{last:05x}: {len(ops):4d}  {counts}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")
