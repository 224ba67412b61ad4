"""The C ABI from C: the example program compiled against the installed library, by hand and
through CMake's find_package(softlight)."""
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import softlight

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "c"


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on PATH")
def test_c_program_links_and_checks_its_result(tmp_path):
    lib = Path(softlight.library_path())
    assert lib.is_file(), "the wheel ships libsoftlight"
    exe = tmp_path / "cpu_example"
    run(["cc", "-std=c99", "-Wall", "-Werror", f"-I{softlight.include_dir()}", str(EXAMPLE / "cpu_example.c"),
         "-o", str(exe), f"-L{lib.parent}", "-lsoftlight", "-lm", f"-Wl,-rpath,{lib.parent}"])
    out = run([str(exe)]).stdout
    assert "ok" in out and "FAILED" not in out


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("cc") is None, reason="no cmake or C compiler")
def test_find_package_softlight(tmp_path):
    build = tmp_path / "build"
    env = dict(os.environ)
    run(["cmake", "-S", str(EXAMPLE), "-B", str(build), f"-Dsoftlight_DIR={softlight.cmake_dir()}"], env=env)
    run(["cmake", "--build", str(build)], env=env)
    out = run([str(build / "cpu_example")]).stdout
    assert "ok" in out


def test_header_is_plain_c(tmp_path):
    # The public header compiles as C and as C++ with nothing but the standard library.
    for compiler, flag in (("cc", "-std=c99"), ("c++", "-std=c++11")):
        if shutil.which(compiler) is None:
            pytest.skip(f"no {compiler}")
        src = tmp_path / ("t.c" if compiler == "cc" else "t.cpp")
        src.write_text("#include <softlight/softlight.h>\n"
                       "int main(void) { return softlight_dtype_size(SOFTLIGHT_FLOAT32) == 4 ? 0 : 1; }\n")
        run([compiler, flag, "-Wall", "-Werror", "-pedantic", f"-I{softlight.include_dir()}", "-c", str(src),
             "-o", str(tmp_path / "t.o")])


def test_default_build_holds_no_environment_or_tuning_names():
    """The shipped library reads no environment variable and has no tuning knob: neither a
    SOFTLIGHT_ name nor any forced value's name is in it (a tuning build exports its interface)."""
    if importlib.util.find_spec("softlight._planner") is not None:
        pytest.skip("a tuning build (SOFTLIGHT_TUNING=ON) holds its interface by design")
    data = Path(softlight.library_path()).read_bytes()
    for name in (b"SOFTLIGHT_", b"softlight_tuning", b"CHUNK_BYTES", b"REGISTER_CLUSTER", b"ROWS_PER_LANE",
                 b"GRID_ROWS", b"SPILL_CHUNKS", b"PEEL_CLUSTERS", b"SPLIT_LANES", b"VERBOSE"):
        assert name not in data, name


@pytest.mark.skipif(shutil.which("pkg-config") is None or shutil.which("cc") is None,
                    reason="no pkg-config or C compiler on PATH")
def test_c_program_builds_with_pkg_config(tmp_path):
    """The installed softlight.pc (relocatable: its prefix is found from its own place) gives the
    flags that build and run the C example."""
    pcdir = Path(softlight.library_path()).parent / "pkgconfig"
    assert (pcdir / "softlight.pc").is_file()
    env = dict(os.environ, PKG_CONFIG_PATH=str(pcdir))
    flags = run(["pkg-config", "--cflags", "--libs", "softlight"], env=env).stdout.split()
    exe = tmp_path / "cpu_example"
    run(["cc", "-std=c99", "-Wall", "-Werror", str(EXAMPLE / "cpu_example.c"), "-o", str(exe), *flags, "-lm"])
    assert "ok" in run([str(exe)]).stdout
