"""The benchmark's host-side parts, without a GPU: argument parsing, the sweep's sizes, the bytes each
op must move, the table, and the committed results' schema (every docs/perf JSON is machine-written;
this keeps them readable by the tools that render them)."""
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from softlight import bench

ROOT = Path(__file__).resolve().parents[1]
PERF = ROOT / "docs" / "perf"


def load_tool(name):
    """tools/<name>.py as a module (the tools are scripts, not a package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_parse_shapes():
    assert bench.parse_shapes("4096x393216, 64X4096x4096") == [(4096, 393216), (64, 4096, 4096)]
    for bad in ("4096", "4096x", "x5", "4096*393216", "4096x-1"):
        with pytest.raises(SystemExit, match="bad shape"):
            bench.parse_shapes(bad)


def test_sweep_cases_hold_about_the_asked_bytes():
    cases = bench.sweep_cases(["float32", "bfloat16"], 1.0)
    assert len(cases) == 2 * len(bench.SWEEP_COLS)
    for (rows, cols), dtype in cases:
        nbytes = rows * cols * (4 if dtype == "float32" else 2)
        assert cols in bench.SWEEP_COLS and 0.5e9 <= nbytes <= 2e9, (rows, cols, dtype)


@pytest.mark.parametrize("shape,dim,n,strides", [
    ((4096, 393216), 1, (4096, 393216, 1), (393216, 1, 1)),
    ((64, 4096, 4096), 1, (64, 4096, 4096), (4096 * 4096, 4096, 1)),
    ((5, 6, 7), 0, (1, 5, 42), (210, 42, 1)),
])
def test_axis_extents(shape, dim, n, strides):
    assert bench.axis_extents(shape, dim) == (n, strides)


def test_moved_bytes_and_table(capsys):
    rows = [
        {"op": "forward", "provider": "copy", "shape": [4096, 393216], "dtype": "float32", "ms": 3.0, "copy_ms": 3.0,
         "status": "ok"},
        {"op": "backward", "provider": "softlight", "shape": [2, 3, 4], "dim": 1, "dtype": "bfloat16", "ms": None,
         "copy_ms": 1.0, "status": "wrong (max |error| 1e-2)"},
    ]
    assert bench.moved_bytes(rows[0]) == 2 * 4096 * 393216 * 4
    assert bench.moved_bytes(rows[1]) == 3 * 24 * 2
    bench.print_table(rows)
    out = capsys.readouterr().out
    assert "4096x393216" in out and "2x3x4 d1" in out and "wrong" in out
    assert f"{2 * 4096 * 393216 * 4 / 3.0 / 1e6:6.0f}" in out  # GB/s of the copy row


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_torch_compile_is_compiled_per_case_or_once_a_dim(mode):
    """--compile static compiles afresh for every case, after resetting dynamo (a function compiled
    for many shapes turns dynamic, and past the recompile limit runs eagerly); --compile dynamic
    compiles once a dim, with dynamic=True. A stand-in for torch records what the bench asks."""
    calls = []

    class Dynamo:
        @staticmethod
        def reset():
            calls.append("reset")

    class FakeTorch:
        _dynamo = Dynamo

        @staticmethod
        def compile(fn, **opts):
            calls.append(("compile", opts["dynamic"]))
            return fn

        @staticmethod
        def log_softmax(t, dim):
            return ("log_softmax", t, dim)

    class Args:
        compile, no_compile, providers, sweep = mode, False, "softlight,torch.compile", True

    provs = bench.providers(Args(), gpu=None, data=None, torch=FakeTorch, op="forward")
    kind, make = provs["torch.compile"]
    assert kind == "log" and set(provs) == {"copy", "softlight", "torch.compile"}
    cases = [bench.Case("forward", (4, 8), 1, "float32", "x%d" % i, None) for i in range(3)]
    cases.append(bench.Case("forward", (2, 3, 5), 1, "float32", "x3", None))
    runs = [make(c) for c in cases]
    assert [r() for r in runs] == [("log_softmax", c.inp, c.dim) for c in cases]
    if mode == "static":
        assert calls == ["reset", ("compile", False)] * 4
    else:
        assert calls == [("compile", True)]


def test_timing_passes_take_turns_and_report_medians():
    """An untimed pass, then rounds of timing, go over every ready provider in turn; each
    provider's ms is the median of its timed rounds, and a provider that fails while timed is
    reported failed, not timed."""
    calls = []

    class FakeGpu:
        def time_ms(self, fn, warmup, reps):
            calls.append(fn())
            if calls[-1] == "bad" and calls.count("bad") > 2:
                raise RuntimeError("lost")
            return {"a": 1.0, "b": 2.0, "bad": 5.0}[calls[-1]] + 0.1 * len(calls)

    class Data:
        @staticmethod
        def on_stream():
            import contextlib
            return contextlib.nullcontext()

    rows = [{"provider": p, "status": "ok", "ms": None} for p in ("a", "b", "bad")]
    ready = [(r, (lambda p=r["provider"]: p)) for r in rows]
    args = type("Args", (), {"passes": 3, "warmup": 0, "reps": 1})
    bench.time_passes(FakeGpu(), Data(), ready, args)
    # the untimed pass, then three in turn; 'bad' dropped once it failed
    assert calls == ["a", "b", "bad"] * 3 + ["a", "b"]
    assert rows[0]["ms_passes"] == pytest.approx([1.4, 1.7, 2.0]) and rows[0]["ms"] == pytest.approx(1.7)
    assert rows[1]["ms"] == pytest.approx(2.8)
    assert rows[2]["ms"] is None and rows[2]["status"].startswith("failed: RuntimeError")
    args.passes = 1
    one = {"provider": "a", "status": "ok", "ms": None}
    bench.time_passes(FakeGpu(), Data(), [(one, lambda: "a")], args)
    assert "ms_passes" not in one and one["ms"] > 1.0


def test_wrong_results_are_timed_but_never_counted(capsys, tmp_path):
    """A provider whose output fails the float64 check is still timed (its speed is worth knowing)
    but keeps its status: the KernelBench line, the plot and the tables never count it."""
    calls = []

    class FakeGpu:
        def time_ms(self, fn, warmup, reps):
            calls.append(fn())
            return {"copy": 3.0, "softlight": 3.1, "torch": 2.0}[calls[-1]]

    class Data:
        @staticmethod
        def on_stream():
            import contextlib
            return contextlib.nullcontext()

    rows = [{"op": "forward", "provider": p, "shape": [4096, 393216], "dtype": "float32", "status": st, "ms": None}
            for p, st in (("copy", "ok"), ("softlight", "ok"), ("torch", "wrong (max |error| 2.20e-05)"))]
    args = type("Args", (), {"passes": 1, "warmup": 0, "reps": 1})
    bench.time_passes(FakeGpu(), Data(), [(r, (lambda p=r["provider"]: p)) for r in rows], args)
    assert calls == ["copy", "softlight", "torch"] * 2 and rows[2]["ms"] == 2.0  # an untimed pass first
    assert [bench.counted(r) for r in rows] == [True, True, False]
    for r in rows:
        r["copy_ms"] = 3.0
    bench.print_table(rows)
    out = capsys.readouterr().out
    assert "wrong (max |error| 2.20e-05)" in out and "faster than Model" not in out  # torch's time is not a result
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"meta": {"gpu": "G", "commit": "c", "date": "d", "torch": "t",
                                         "command": "python -m softlight bench --out-dir /x"}, "rows": rows}))
    def table(*extra):
        return subprocess.run([sys.executable, str(ROOT / "tools" / "perf_table.py"), str(path), *extra],
                              capture_output=True, text=True, check=True).stdout
    assert "| 3.000 | 3.100 (1.03) | wrong (2.000) |" in table("--compact")
    assert "| torch | wrong (2.000) | |  |" in table()


RESULTS = sorted(PERF.glob("*.json"))


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.name)
def test_committed_results_follow_the_schema(path):
    doc = json.loads(path.read_text())
    assert {"gpu", "commit", "command", "softlight_version", "torch", "date"} <= set(doc["meta"])
    assert doc["meta"]["command"].startswith("python -m softlight bench")
    assert doc["rows"]
    for r in doc["rows"]:
        assert r["op"] in ("forward", "backward")
        assert r["provider"] in ("softlight", "copy", "torch", "torch.compile", "quack", "liger")
        assert r["dtype"] in ("float32", "float16", "bfloat16", "float64")
        assert all(isinstance(v, int) and v > 0 for v in r["shape"])
        assert "copy_ms" in r and "status" in r
        if r["status"] == "ok" or (r["status"].startswith("wrong") and r["ms"] is not None):
            assert r["ms"] > 0 and math.isfinite(r["ms"])  # wrong results are timed, in newer files
        else:
            assert r["ms"] is None
    # Every case has the floor measured in the same run.
    for r in doc["rows"]:
        assert r["copy_ms"] and r["copy_ms"] > 0


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.name)
def test_perf_table_renders_every_result(path):
    for extra in ([], ["--compact"]):
        out = subprocess.run([sys.executable, str(ROOT / "tools" / "perf_table.py"), str(path)] + extra,
                             capture_output=True, text=True, check=True).stdout
        assert out.count("\n| ") >= 2 and "softlight" in out


def test_sass_loops_counts_each_loop_by_class():
    """tools/sass_loops.py on a made-up listing: two functions, the second with a loop nested in
    another; only the named function is read."""
    sass = load_tool("sass_loops")
    listing = """
        Function : _Z5otherv
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   BRA 0x0 ;
        Function : _Z4hotv
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDS.128 R4, [R2] ;
        /*0020*/                   MUFU.EX2 R5, R5 ;
        /*0030*/                   FFMA R6, R5, R7, R8 ;
        /*0040*/               @P0 BRA 0x10 ;
        /*0050*/                   STG.E.128 desc[UR4][R2.64], R4 ;
        /*0060*/              @!P1 BRA 0x0 ;
        /*0070*/                   EXIT ;
    """.split("\n")
    (name, code), = [f for f in sass.functions(listing) if "hot" in f[0]]
    assert name == "_Z4hotv" and len(code) == 8
    found = list(sass.loops(code))
    assert [(a, b, len(ops)) for a, b, ops in found] == [(0x10, 0x40, 4), (0x0, 0x60, 7)]
    inner = found[0][2]
    assert inner == ["LDS.128", "MUFU.EX2", "FFMA", "BRA"]
    assert sum(o.startswith("STG") for o in found[1][2]) == 1



def test_sass_loads_finds_a_load_waited_on_before_the_packs():
    """tools/sass_loads.py on a made-up listing: in the first function a 16-bit load's register is
    used before two of the 16-byte loads after it issue (the warp waits a whole load there); in the
    second a pack loads into the narrow load's register; in the third a pack is summed before the
    next is loaded; in the fourth the narrow load comes after the packs. Only the instructions
    before the first CTA barrier count, and a predicated early exit does not end them."""
    tool = load_tool("sass_loads")
    listing = """
        Function : _Z5earlyv
        /*0000*/               @P0 EXIT ;
        /*0010*/               @P1 LDG.E.U16 R8, desc[UR4][R8.64] ;
        /*0020*/               @P2 LDG.E.128 R12, desc[UR4][R2.64] ;
        /*0030*/               @P1 SHF.L.U32 R34, R8, 0x10, RZ ;
        /*0040*/                   MOV R8, 0xff80ff80 ;
        /*0050*/               @P4 LDG.E.128 R8, desc[UR4][R4.64] ;
        /*0060*/               @P5 LDG.E.128 R20, desc[UR4][R6.64] ;
        /*0070*/                   BAR.SYNC.DEFER_BLOCKING 0x1, R25 ;
        /*0080*/                   LDG.E.128 R4, desc[UR4][R6.64] ;
        Function : _Z6reloadv
        /*0000*/               @P1 LDG.E.U16 R9, desc[UR4][R2.64] ;
        /*0010*/               @P4 LDG.E.128 R8, desc[UR4][R4.64] ;
        /*0020*/               @P5 LDG.E.128 R20, desc[UR4][R6.64] ;
        Function : _Z6summedv
        /*0000*/                   LDG.E.128 R8, desc[UR4][R2.64] ;
        /*0010*/                   FADD R40, RZ, R10 ;
        /*0020*/                   LDG.E.128 R12, desc[UR4][R4.64] ;
        Function : _Z4latev
        /*0000*/               @P2 LDG.E.128 R12, desc[UR4][R2.64] ;
        /*0010*/               @P4 LDG.E.128 R8, desc[UR4][R4.64] ;
        /*0020*/                   WARPSYNC.ALL ;
        /*0030*/               @P1 LDG.E.U16 R30, desc[UR4][R30.64] ;
        /*0040*/               @P1 SHF.L.U32 R34, R30, 0x10, RZ ;
        /*0050*/                   SHFL.BFLY PT, R5, R4, 0x1, 0x1f ;
    """.split("\n")
    (_, early), (_, reload), (_, summed), (_, late) = list(tool.functions(listing))
    assert "".join(k for _, k, _ in tool.loads(tool.head(early))) == "EPPP"
    assert tool.waits(tool.head(early)) == [(0x10, "E", 0x30, 2)]
    assert tool.waits(reload) == [(0x0, "E", 0x10, 2)]  # R9 loaded again by the pack into R8-R11
    assert tool.waits(summed) == [(0x0, "P", 0x10, 1)]  # a pack summed before the next is loaded
    assert "".join(k for _, k, _ in tool.loads(tool.head(late))) == "PPE" and tool.waits(tool.head(late)) == []


def test_ncu_sass_blocks_and_stalls(tmp_path):
    """tools/ncu_sass.py on a made-up source page: the kernel's name line, the header, two straight
    runs of code (a loop body executed 10 times, a spin loop executed 40 times) and one instruction
    executed once; blocks by share of the instructions, stalls by samples with their main reasons."""
    ncu = load_tool("ncu_sass")
    head = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
            "stall_long_sb", "stall_wait", "stall_long_sb (Not Issued)"]
    body = [["0x10", "LDS.128 R4, [R2]", "2", "10", "1", "1", "9"],
            ["0x20", "MUFU.EX2 R5, R5", "4", "10", "0", "4", "9"],
            ["0x30", "YIELD", "0", "40", "0", "0", "0"],
            ["0x40", "@!P3  BRA 0x30", "12", "40", "12", "0", "0"],
            ["0x50", "EXIT", "2", "1", "0", "2", "0"]]
    f = tmp_path / "sass.csv"
    f.write_text("\n".join(",".join(f'"{v}"' for v in r) for r in [["Kernel Name", "k"], head] + body) + "\n")
    header, rows = ncu.read(f)
    assert header == head and len(rows) == 5
    assert ncu.opcode("@!P3  BRA 0x30") == "BRA" and ncu.opcode("EXIT") == "EXIT"
    b = ncu.blocks(header, rows)
    assert [(n, length, i, ops) for _, n, length, _, i, ops in b] == \
        [(40, 2, 2, ["YIELD", "BRA"]), (10, 2, 0, ["LDS.128", "MUFU.EX2"]), (1, 1, 4, ["EXIT"])]
    assert b[0][0] == pytest.approx(80 / 101) and b[0][3] == pytest.approx(12 / 20)
    totals, per = ncu.stalls(header, rows)
    assert totals == pytest.approx({"long_sb": 13 / 20, "wait": 7 / 20})  # not the "(Not Issued)" column
    assert per[0][1] == 3 and per[0][4][0] == ("long_sb", 12) and per[1][1] == 1
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "ncu_sass.py"), str(f)], capture_output=True,
                         text=True, check=True).stdout
    assert out.startswith("101 warp instructions executed, 5 in the kernel") and "long_sb 65.0 %" in out

def test_ab_builds_summary_takes_medians_over_rounds(tmp_path, capsys):
    """tools/ab_builds.py summary: per shape and build, the median time over the rounds, its ratio
    to the median floor of the same build, the largest error of any round; a build missing at a
    shape shows '-'; lines other than RESULT are skipped."""
    ab = load_tool("ab_builds")
    f = tmp_path / "ab.txt"
    rounds = [("old", {"8x4096:float32": [0.5, 0.60, 1e-6], "8x4096:float32:backward": [0.8, 1.2, 2e-6]}),
              ("new", {"8x4096:float32": [0.5, 0.55, 3e-6]}),
              ("old", {"8x4096:float32": [0.4, 0.50, 4e-6], "8x4096:float32:backward": [0.8, 1.0, 1e-6]}),
              ("new", {"8x4096:float32": [0.5, 0.52, 1e-6]}),
              ("old", {"8x4096:float32": [0.9, 0.95, 1e-6], "8x4096:float32:backward": [0.8, 1.6, 1e-6]})]
    f.write_text("build rc 0\n" + "".join(f"RESULT {label} {json.dumps(r)}\n" for label, r in rounds))
    ab.summary(str(f))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["shape", "new", "old"]
    fwd, = [line.split() for line in lines if line.startswith("8x4096:float32 ")]
    # new: times 0.55, 0.52 -> 0.535 over floors 0.5 -> 1.070; old: times 0.60, 0.50, 0.95 -> 0.60 over
    # floors 0.5, 0.4, 0.9 -> 0.5 (means would give 0.683 and 0.6), largest error 4e-06
    assert fwd[1:] == ["0.5350", "1.070x", "3e-06", "0.6000", "1.200x", "4e-06"]
    bwd, = [line.split() for line in lines if line.startswith("8x4096:float32:backward")]
    assert bwd[1:] == ["-", "1.2000", "1.500x", "2e-06"]


def test_sweep_targets_counts_only_checked_results(tmp_path):
    """tools/sweep_targets.py: a point is ahead where softlight's time is no more than every counted
    anchor's; the copy bound (1.05 x) holds from rows of 1024 elements; a wrong anchor, timed all the
    same, is not counted, and a point without any anchor is ahead."""
    def point(cols, dtype, copy, sl, **anchors):
        rows = [dict(provider="copy", ms=copy), dict(provider="softlight", ms=sl)]
        for p, ms in anchors.items():
            rows.append(dict(provider=p, ms=abs(ms), status="ok" if ms > 0 else "wrong (max |error| 1e-2)"))
        return [dict(op="forward", shape=[1 << 20, cols], dtype=dtype, status=r.pop("status", "ok"), **r)
                for r in rows]
    rows = (point(128, "float32", 0.50, 0.55, torch=0.60)  # ahead; 1.1 x copy, but under 1024 elements
            + point(1024, "float32", 0.50, 0.52, quack=0.51, torch=0.70)  # behind quack by 2 %
            + point(4096, "bfloat16", 0.50, 0.53, quack=0.60)  # ahead, over the bound (1.06 x)
            + point(32768, "float16", 0.50, 0.51, quack=-0.40)  # the wrong anchor does not count
            + point(7, "float16", 0.50, 0.70))  # no anchor ran
    rows.append(dict(op="backward", provider="softlight", shape=[8, 8], dtype="float32", status="ok", ms=9.0))
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"meta": {}, "rows": rows}))
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "sweep_targets.py"), str(path), "--points"],
                         capture_output=True, text=True, check=True).stdout
    assert "ahead of every anchor at 4 of 5 points; both targets at 3" in out
    assert "behind: float32 1024 (quack by 2.0 %)" in out
    assert "from 1024 elements: bfloat16 4096 (1.060 x)\n" in out
    assert "float16      32768  1.020 x copy  no anchor" in out


def test_sweep_targets_compares_runs(tmp_path):
    """tools/sweep_targets.py with several sweeps: each is judged, then a table lists every point
    that misses a target in any of them (x copy in each; the anchor ahead and by how much)."""
    def sweep(name, sl_4096, sl_128):
        rows = []
        for cols, sl, quack in ((4096, sl_4096, 0.56), (128, sl_128, 0.51), (32768, 0.50, 0.51)):
            for p, ms in (("copy", 0.50), ("softlight", sl), ("quack", quack)):
                rows.append(dict(op="forward", provider=p, shape=[1 << 20, cols], dtype="float32", status="ok", ms=ms))
        (tmp_path / name).write_text(json.dumps({"meta": {}, "rows": rows}))
        return name
    runs = [sweep("a.json", 0.51, 0.50), sweep("b.json", 0.53, 0.52)]
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "sweep_targets.py"), *runs], cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout
    assert "== a.json\nahead of every anchor at 3 of 3 points; both targets at 3" in out
    assert "== b.json\nahead of every anchor at 2 of 3 points; both targets at 1" in out
    table = out[out.index("| point |"):].splitlines()
    assert table[0] == "| point | a.json | b.json |"
    assert table[2:] == ["| float32 4096 | 1.020 | 1.060 |", "| float32 128 | 1.000 | 1.040 (quack +2.0 %) |"]


def test_merge_results_joins_parts_of_one_run(tmp_path):
    """tools/merge_results.py: parts of one GPU, commit and torch join in order, their commands and
    dates kept; a part of another commit, or a case timed in two parts, is refused."""
    def part(name, dtype, commit="c", date="d1"):
        rows = [dict(op="forward", provider=p, shape=[8, 128], dtype=dtype, status="ok", ms=ms, copy_ms=1.0)
                for p, ms in (("copy", 1.0), ("softlight", 1.1))]
        meta = dict(gpu="G", commit=commit, torch="t", softlight_version="v", date=date,
                    command=f"python -m softlight bench --sweep --dtypes {dtype}")
        path = tmp_path / name
        path.write_text(json.dumps({"meta": meta, "rows": rows}))
        return str(path)

    def merge(*parts):
        return subprocess.run([sys.executable, str(ROOT / "tools" / "merge_results.py"), str(tmp_path / "m.json"),
                               *parts], capture_output=True, text=True)
    a, b = part("a.json", "float32"), part("b.json", "bfloat16", date="d2")
    assert merge(a, b).returncode == 0
    doc = json.loads((tmp_path / "m.json").read_text())
    assert [r["dtype"] for r in doc["rows"]] == ["float32"] * 2 + ["bfloat16"] * 2
    assert doc["meta"]["command"] == ("python -m softlight bench --sweep --dtypes float32 ; "
                                      "python -m softlight bench --sweep --dtypes bfloat16")
    assert doc["meta"]["date"] == "d1, d2" and doc["meta"]["commit"] == "c"
    other = merge(a, part("o.json", "float16", commit="e"))
    assert other.returncode != 0 and "differ in commit" in other.stderr
    twice = merge(a, part("t.json", "float32"))
    assert twice.returncode != 0 and "in two parts" in twice.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("tool", ["grid_rows_trace.cu", "cluster_rows_trace.cu"])
def test_trace_tools_build(tmp_path, tool):
    """The trace tools compile the library's grid_rows and cluster_rows kernels with their trace
    points on, so a change to a kernel that breaks them shows here, without a GPU."""
    cmd = ["nvcc", "-std=c++17", "-O1", "-arch=sm_90a", f"-I{ROOT / 'src'}", f"-I{ROOT / 'include'}", "-c",
           str(ROOT / "tools" / tool), "-o", str(tmp_path / "trace.o")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


def test_slice_balance_bands_and_the_planners_resized_chunks():
    """tools/slice_balance.py: consecutive lengths of one plan form a band; the fullest CTA's share
    is 1 where every CTA holds as many bytes, and over 1 where some hold a chunk less. Every plan whose
    chunks the planner resized (the two-chunk and four-chunk rules) shares its rows evenly, to the
    chunks' 16-byte rounding; plans in 32 KB chunks may not (the bands no rule covers)."""
    sb = load_tool("slice_balance")
    uneven = []
    for cols in range(132000, 560000, 2000):
        p = sb.plan_of(cols, 2)
        f = sb.fullest(p, cols, 2)
        if p["family"] != "cluster_rows":
            assert f is None
        elif p["chunk_bytes"] != 32768:
            assert 1.0 <= f < 1.001, (cols, p)
        elif f > 1.01:
            uneven.append((cols, p["cluster"], p["chunks_per_cta"]))
    # Left uneven: three 32 KB chunks a CTA over 4 and 8, two over 8 (14 and 15 chunks), two over 16
    # (29 to 31 chunks); never the lengths the rules took.
    assert {(c, m) for _, c, m in uneven} == {(4, 3), (8, 2), (8, 3), (16, 2)}
    assert not [cols for cols, c, m in uneven if 196608 < cols <= 212992 or 393216 < cols <= 458752]
    # Rows of 13 chunks, 16 over clusters of 4: one band a ring size (nine slots, then eight).
    got = [(first, last, p["cluster"], p["chunks_per_cta"], p["ring_slots"], round(f0, 3), round(f1, 3))
           for first, last, p, _, f0, f1 in sb.bands(2, 200000, 212992, 4096)]
    assert got == [(200000, 204096, 4, 4, 9, 1.0, 1.0), (208192, 212288, 4, 4, 8, 1.0, 1.0)]
    assert sb.fullest(sb.plan_of(216000, 2), 216000, 2) == 8 * 2 * 32768 / 432000
