"""The benchmark's host-side parts, without a GPU: argument parsing, the sweep's sizes, the bytes each
op must move, the table, the plot's lines, and the committed results' schema (every docs/perf JSON is
machine-written)."""
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from softlight.bench import forward as bench
from softlight.bench import main as bench_main

ROOT = Path(__file__).resolve().parents[1]
PERF = ROOT / "docs" / "perf"


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


@pytest.mark.parametrize("shape,strides", [
    ((4096, 393216), (393216, 1)),
    ((64, 4096, 4096), (4096 * 4096, 4096, 1)),
    ((5, 6, 7), (42, 7, 1)),
])
def test_c_strides(shape, strides):
    assert bench.c_strides(shape) == strides


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
    assert "torch" not in {p for p, *_ in bench.ratio_lines(rows)}  # nor does the plot


RESULTS = sorted(PERF.glob("*.json"))
LINEAR_PROVIDERS = ("gemms", "softlight", "softlight-low_memory", "matmul+softlight", "torch", "torch.compile", "liger",
                    "cce", "cce-exact", "softlight-row_stats", "softlight-row_stats-low_memory")


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.name)
def test_committed_results_follow_the_schema(path):
    doc = json.loads(path.read_text())
    assert {"commit", "command", "softlight_version", "torch", "date"} <= set(doc["meta"])
    assert ("gpu" in doc["meta"]) != ("cpu" in doc["meta"])  # a GPU benchmark or the CPU's
    assert doc["rows"]
    if doc["meta"].get("op") == "vocab-parallel":
        ranks = doc["meta"]["ranks"]
        want = f"torchrun --nproc-per-node {ranks} -m softlight bench --vocab-parallel"
        assert doc["meta"]["command"].startswith(want)
        for r in doc["rows"]:
            assert r["op"] in ("cross_entropy", "token_logprobs", "entropy", "log_softmax")
            assert r["provider"] in ("copy", "softlight", "one-rank", "torch-vp") or \
                (r["op"] == "cross_entropy" and r["provider"] == "all_gather")
            assert r["ranks"] == ranks and r["shard"] == [r["shape"][0], r["shape"][1] // ranks]
            assert r["copy_ms"] > 0 and (r["ms"] > 0 if r["status"] == "ok" else r["ms"] is None)
        return
    assert doc["meta"]["command"].startswith("python -m softlight bench")
    if doc["rows"][0]["op"] == "hf_step":
        for r in doc["rows"]:
            assert r["provider"] in ("transformers", "softlight", "softlight-low_memory", "liger", "liger-flce"), \
                r["provider"]
            assert r["dtype"] == "bfloat16"
            assert (r["ms"] > 0 and r["peak_mib"] > 0) if r["status"] == "ok" else r["status"]
        return
    if doc["rows"][0]["op"] == "linear_cross_entropy":
        for r in doc["rows"]:
            stats = r["provider"].startswith("softlight-row_stats")
            assert r["op"] == ("linear_row_stats" if stats else "linear_cross_entropy"), r
            assert len(r["shape"]) == 3 and all(v > 0 for v in r["shape"])
            assert r["provider"] in LINEAR_PROVIDERS, r
            assert r["mode"] == {"softlight": "default", "softlight-low_memory": "low_memory",
                                 "softlight-row_stats": "default",
                                 "softlight-row_stats-low_memory": "low_memory"}.get(r["provider"])
            assert r["dtype"] in ("float32", "float16", "bfloat16", "float64") and r["grads_mib"] >= 0
            assert r["gemms_ms"] > 0 and (r["ms"] > 0 if r["status"] == "ok" else r["ms"] is None or r["ms"] > 0)
            if "cpu" in doc["meta"]:  # (the allocator's peak is measured on the GPU alone)
                assert r["peak_mib"] is None
            elif r["provider"] != "gemms" and r["status"] == "ok":
                assert r["peak_mib"] >= 0
        return
    if doc["rows"][0]["op"] == "host":
        for r in doc["rows"]:
            assert r["op"] == "host" and r["shape"] == [8, 1000] and r["dtype"] == "float32" and r["us"] > 0
            assert r["provider"] in ("softlight", "softlight_out", "softlight_raw", "softlight_cupy", "torch",
                                     "softlight.torch", "softlight_op", "torch_grad", "softlight.torch_grad",
                                     "function_grad")
        return
    consumer = doc["rows"][0]["op"] in ("cross_entropy", "token_logprobs", "entropy", "logsumexp")
    for r in doc["rows"]:
        assert r["op"] == doc["rows"][0]["op"] if consumer else r["op"] in ("forward", "backward")
        assert r["provider"] in ("softlight", "copy", "torch", "torch.compile", "quack", "liger") or \
            ("cpu" in doc["meta"] and r["provider"] == "numpy") or (consumer and r["provider"] == "gather-lse") or \
            (r["op"] == "cross_entropy" and r["provider"] in ("softlight-in-place", "softlight-loss",
                                                              "torch-loss")) or \
            (r["op"] == "token_logprobs" and r["provider"] in ("softlight-backward", "torch-backward",
                                                             "gather-lse-backward", "torch.compile-backward"))
        if r["op"] == "cross_entropy" and r["provider"].endswith("-loss"):
            assert r["mode"] == "loss", r
        elif r["op"] == "cross_entropy" and r["provider"].startswith("softlight"):
            assert r["mode"] == ("in-place" if r["provider"] == "softlight-in-place" else "new"), r
        if r["op"] == "token_logprobs" and r["provider"] != "copy" and "mode" in r:  # (older files: forward alone)
            assert r["mode"] == ("backward" if r["provider"].endswith("-backward") else "forward"), r
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


def test_plot_lines_are_times_over_the_copy_by_row_length():
    rows = [{"op": "forward", "provider": p, "shape": [s, c], "dtype": d, "status": "ok", "ms": ms, "copy_ms": 2.0}
            for p, ms in (("copy", 2.0), ("softlight", 2.1), ("torch", 4.0)) for d in ("float32", "bfloat16")
            for s, c in ((100, 4096), (1000, 128))]
    rows.append(dict(rows[-1], provider="liger", status="wrong (max |error| 1)"))
    lines = bench.ratio_lines(rows)
    assert sorted((p, d) for p, d, _, _ in lines) == [("softlight", "bfloat16"), ("softlight", "float32"),
                                                      ("torch", "bfloat16"), ("torch", "float32")]
    for p, d, op, pts in lines:
        assert [x for x, _ in pts] == [128, 4096] and all(y == (1.05 if p == "softlight" else 2.0) for _, y in pts)


def test_cpu_sweep_cases_cover_the_row_lengths_both_axes_and_dtypes():
    from softlight.bench import cpu as bench_cpu
    cases = list(bench_cpu.cpu_cases(["float32", "float64", "bfloat16"]))
    assert len(cases) == 3 * 2 * len(bench_cpu.CPU_COLS)
    assert {shape[dim] for shape, dim, _ in cases} == set(bench_cpu.CPU_COLS)
    assert {len(shape) for shape, _, _ in cases} == {2, 3}  # the last axis, and the middle of three
    for shape, dim, _ in cases:
        assert 0.5 * bench_cpu.CPU_ELEMENTS <= math.prod(shape) <= 2 * bench_cpu.CPU_ELEMENTS, shape
        assert dim == 1


def test_cpu_numpy_anchor_is_the_three_line_form():
    from softlight.bench import cpu as bench_cpu
    x = np.random.default_rng(0).standard_normal((5, 9, 3)).astype(np.float32)
    ref = x.astype(np.float64) - x.max(1, keepdims=True)
    ref -= np.log(np.exp(ref).sum(1, keepdims=True))
    assert bench_cpu.check(bench_cpu.numpy_log_softmax(x, 1), ref, "float32") is None
    assert bench_cpu.check(ref + 1e-3, ref, "float32").startswith("wrong")


def test_consumer_bench_runs_checks_and_writes_its_results(tmp_path):
    """bench --op on the CPU, small: every provider checked against float64 and timed beside the copy;
    the files follow the results' schema."""
    pytest.importorskip("torch")
    for op in ("cross_entropy", "token_logprobs", "entropy", "logsumexp"):
        code = bench_main(["--device", "cpu", "--op", op, "--vocabs", "1000", "--dtypes", "float32,bfloat16",
                           "--sweep-gb", "0.0005", "--reps", "1", "--no-compile", "--out-dir", str(tmp_path),
                           "--commit", "test"])
        assert code == 0
        doc = json.loads((tmp_path / f"{op}-cpu.json").read_text())
        assert {r["provider"] for r in doc["rows"]} >= {"copy", "softlight", "torch"}
        if op == "token_logprobs":  # the backward too, each mode named
            assert {r["provider"] for r in doc["rows"]} >= {"softlight-backward", "torch-backward"}
            assert {r.get("mode") for r in doc["rows"]} == {None, "forward", "backward"}
        if op == "cross_entropy":  # the loss alone too
            assert {r["provider"] for r in doc["rows"]} >= {"softlight-loss", "torch-loss"}
            assert {r.get("mode") for r in doc["rows"]} == {None, "new", "in-place", "loss"}
        assert all(r["status"] == "ok" and r["ms"] > 0 and r["copy_ms"] > 0 for r in doc["rows"])
        # (The plot needs matplotlib, the bench extra; without it the run says so and writes none.)
        assert (tmp_path / f"{op}-cpu.png").exists() == (importlib.util.find_spec("matplotlib") is not None)
        test_committed_results_follow_the_schema(tmp_path / f"{op}-cpu.json")


def test_linear_bench_runs_checks_and_writes_its_results(tmp_path):
    """bench --op linear_cross_entropy on the CPU, small: each provider checked against float64 and
    timed beside the bare GEMMs; the file follows the schema."""
    pytest.importorskip("torch")
    code = bench_main(["--device", "cpu", "--op", "linear_cross_entropy", "--shapes", "40x16x300,9x8x1000",
                       "--dtypes", "float32,bfloat16", "--reps", "1", "--no-compile", "--out-dir", str(tmp_path),
                       "--commit", "test"])
    assert code == 0
    doc = json.loads((tmp_path / "linear_cross_entropy-cpu.json").read_text())
    assert {r["provider"] for r in doc["rows"]} == {"gemms", "softlight", "softlight-low_memory", "matmul+softlight",
                                                     "torch", "softlight-row_stats", "softlight-row_stats-low_memory"}
    assert all(r["status"] == "ok" and r["ms"] > 0 for r in doc["rows"])
    test_committed_results_follow_the_schema(tmp_path / "linear_cross_entropy-cpu.json")


def test_linear_bench_checks_the_row_statistics_against_their_own_reference(tmp_path, monkeypatch):
    """The row statistics' loss weighs the entropy: a reference that weighs it otherwise finds their
    gradients wrong, and the run fails."""
    pytest.importorskip("torch")
    from softlight.bench import linear
    real = linear.reference
    monkeypatch.setattr(linear, "reference", lambda torch, h, w, t, entropy=0.0: real(torch, h, w, t, 1.5 * entropy))
    code = bench_main(["--device", "cpu", "--op", "linear_cross_entropy", "--shapes", "40x16x300", "--dtypes",
                       "float32", "--reps", "1", "--no-compile", "--providers", "softlight,softlight-row_stats",
                       "--out-dir", str(tmp_path), "--commit", "test"])
    assert code == 1
    rows = {r["provider"]: r for r in json.loads((tmp_path / "linear_cross_entropy-cpu.json").read_text())["rows"]}
    assert rows["softlight"]["status"] == "ok" and rows["softlight-row_stats"]["status"].startswith("wrong"), rows


def test_linear_bench_finds_a_wrong_gradient(tmp_path, monkeypatch):
    """A provider whose weight gradient is off by 5 % is reported wrong, and the run fails."""
    torch = pytest.importorskip("torch")
    from softlight import _linear
    real = _linear._TokenGrads.finish

    def finish(self, scale):
        real(self, scale)
        if self.weight is not None:
            self.weight.mul_(1.05)

    monkeypatch.setattr(_linear._TokenGrads, "finish", finish)
    code = bench_main(["--device", "cpu", "--op", "linear_cross_entropy", "--shapes", "40x16x300", "--dtypes",
                       "float32", "--reps", "1", "--no-compile", "--providers", "softlight", "--out-dir",
                       str(tmp_path), "--commit", "test"])
    assert code == 1
    rows = json.loads((tmp_path / "linear_cross_entropy-cpu.json").read_text())["rows"]
    assert next(r for r in rows if r["provider"] == "softlight")["status"].startswith("wrong gradient to weight")
    del torch


def test_consumer_bench_finds_a_wrong_gradient(tmp_path, monkeypatch):
    """token_logprobs' backward mode checks each gradient against float64: one a tenth off is reported
    wrong (and still timed), beside softlight's, right; one whose forward fails is reported failed."""
    pytest.importorskip("torch")
    from softlight.bench import consumers as bench_consumers

    plain = bench_consumers.providers

    def with_a_wrong_one(torch, op, device, no_compile):
        p = plain(torch, op, device, no_compile)
        p["torch-backward"] = bench_consumers.Backward(lambda x, t, idx: p["torch"](x * 1.1, t, idx))
        p["gather-lse-backward"] = bench_consumers.Backward(lambda x, t, idx: x.no_such_method())
        return p

    monkeypatch.setattr(bench_consumers, "providers", with_a_wrong_one)
    assert bench_main(["--device", "cpu", "--op", "token_logprobs", "--vocabs", "1000", "--dtypes", "float32",
                       "--sweep-gb", "0.0005", "--reps", "1", "--no-compile", "--out-dir", str(tmp_path),
                       "--commit", "test"]) == 0
    rows = {r["provider"]: r for r in json.loads((tmp_path / "token_logprobs-cpu.json").read_text())["rows"]}
    assert rows["torch-backward"]["status"].startswith("wrong gradient") and rows["torch-backward"]["ms"] > 0
    assert rows["gather-lse-backward"]["status"].startswith("failed: AttributeError")
    assert rows["gather-lse-backward"]["ms"] is None
    assert rows["softlight-backward"]["status"] == "ok" and rows["torch"]["status"] == "ok"


def test_consumer_bench_gives_each_provider_its_own_logits(tmp_path, monkeypatch):
    """A provider that writes over its logits (Liger's cross-entropy writes its gradient there) leaves
    the next provider's input as it was."""
    pytest.importorskip("torch")
    from softlight.bench import consumers as bench_consumers

    plain = bench_consumers.providers

    def with_a_writer(torch, op, device, no_compile):
        p = plain(torch, op, device, no_compile)
        right = p.pop("torch")

        def writer(x, t, idx):
            out = right(x, t, idx)
            with torch.no_grad():
                x.fill_(0.0)  # over its own input, after its result is taken
            return out
        return {"writer": writer, "torch": right, **p}

    monkeypatch.setattr(bench_consumers, "providers", with_a_writer)
    for op in ("cross_entropy", "entropy"):
        assert bench_main(["--device", "cpu", "--op", op, "--vocabs", "1000", "--dtypes", "float32",
                           "--sweep-gb", "0.0005", "--reps", "1", "--no-compile", "--out-dir", str(tmp_path),
                           "--commit", "test"]) == 0
        rows = json.loads((tmp_path / f"{op}-cpu.json").read_text())["rows"]
        assert [r["provider"] for r in rows][:3] == ["copy", "writer", "torch"]
        assert all(r["status"] == "ok" for r in rows), [(r["provider"], r["status"]) for r in rows]


def test_command_line_subcommands(capsys):
    """argparse subcommands: help that does not run the demo, an unknown command refused with the
    choices, info --json."""
    import json

    from softlight.__main__ import main as cli
    with pytest.raises(SystemExit) as e:
        cli(["demo", "--help"])
    assert e.value.code == 0 and "usage: python -m softlight demo" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        cli(["frob"])
    assert e.value.code == 2 and "invalid choice: 'frob'" in capsys.readouterr().err
    assert cli(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["version"] == __import__("softlight").__version__ and "gpu_kernels_built" in info


def test_cpu_bench_honours_shapes_and_writes_its_own_folder(tmp_path, monkeypatch, capsys):
    """--device cpu times the --shapes asked along --dim, writes softlight-bench/ in the working
    directory by default (never docs/perf), and refuses options it does not time."""
    bench = bench_main
    monkeypatch.chdir(tmp_path)
    assert bench(["--device", "cpu", "--shapes", "6x100,4x5x30", "--dim", "1", "--dtypes", "float32",
                  "--reps", "1", "--no-torch"]) == 0
    doc = json.loads((tmp_path / "softlight-bench" / "cpu.json").read_text())
    assert sorted(tuple(r["shape"]) for r in doc["rows"] if r["provider"] == "softlight") == [(4, 5, 30), (6, 100)]
    assert {r["dim"] for r in doc["rows"]} == {1}
    with pytest.raises(SystemExit, match="not --op backward"):
        bench(["--device", "cpu", "--op", "backward"])
