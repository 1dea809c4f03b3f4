"""The CMake package: `cmake --install` the build into a fresh prefix, build examples/minimal on
its own (find_package(fsdp_cpp), fsdp::fsdp, LibTorch found the usual way) and run it with the
installed fsdprun at W = 2. Asserted: the installed tree has the headers, the library, the config
files and fsdprun; the outside build succeeds; both ranks train and print their peak memory. The
build tree is a package too: find_package(fsdp_cpp) pointed at BUILD_DIR finds BUILD_DIR's own
config and targets, and examples/minimal built against it trains. Every program linked with fsdp,
ours and the package's user's, names libstdc++.so.6 before LibTorch's libraries ([Note: libstdc++
before LibTorch] in src/CMakeLists.txt: some wheels export std::filesystem functions that crash).
Without LibTorch or nlohmann_json, find_package(fsdp_cpp) fails naming the missing package and
where it comes from.

install_test.py BUILD_DIR SOURCE_DIR TORCH_PYTHON
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def run(command, **kwargs):
    r = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert r.returncode == 0, f"{' '.join(map(str, command))} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def assert_cxx_runtime_first(binary):
    """libstdc++.so.6 comes before every LibTorch library among `binary`'s NEEDED entries."""
    dynamic = run(["readelf", "-d", binary])
    needed = [line.split("[", 1)[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line]
    torch_libs = [i for i, name in enumerate(needed) if name.startswith(("libtorch", "libc10"))]
    assert "libstdc++.so.6" in needed and torch_libs, f"{binary}: NEEDED {needed}"
    assert needed.index("libstdc++.so.6") < min(torch_libs), \
        f"{binary} names LibTorch before libstdc++.so.6 (NEEDED {needed}): a wheel's exported copies would win"


def missing_dependencies(source, prefix, torch_prefix, tmp):
    """find_package(fsdp_cpp) without one of the dependencies the package needs (LibTorch, left
    off CMAKE_PREFIX_PATH; nlohmann_json, its /usr prefix ignored) fails at configure time with
    a line naming the missing package and where it comes from."""
    cases = [
        ("Torch", [f"-DCMAKE_PREFIX_PATH={prefix}"],
         ["fsdp_cpp needs Torch, which was not found", "pip install torch==", "cmake_prefix_path"]),
        ("nlohmann_json", [f"-DCMAKE_PREFIX_PATH={prefix};{torch_prefix}", "-DCMAKE_IGNORE_PREFIX_PATH=/usr"],
         ["fsdp_cpp needs nlohmann_json, which was not found", "apt-get install nlohmann-json3-dev"]),
    ]
    for name, flags, needles in cases:
        r = subprocess.run(["cmake", "-S", Path(source) / "examples" / "minimal", "-B", tmp / f"without-{name}",
                            "-G", "Ninja", *flags], capture_output=True, text=True)
        output = " ".join((r.stdout + r.stderr).split())  # CMake wraps long messages
        lacking = [n for n in needles if n not in output]
        assert r.returncode != 0 and not lacking, \
            f"configure without {name}: exit {r.returncode}, message lacks {lacking}:\n{output[-3000:]}"
        print(f"without {name}: find_package(fsdp_cpp) fails naming it: "
              f"{output[output.find('fsdp_cpp needs'):][:160]}")


def main(build, source, torch_python):
    torch_prefix = run([torch_python, "-c", "import torch; print(torch.utils.cmake_prefix_path)"]).strip()
    with tempfile.TemporaryDirectory() as tmp:
        prefix = Path(tmp) / "prefix"
        run(["cmake", "--install", build, "--prefix", prefix])
        expected = ["include/fsdp/fsdp.h", "bin/fsdprun", "lib/cmake/fsdp_cpp/fsdp_cppConfig.cmake",
                    "lib/cmake/fsdp_cpp/fsdp_cppConfigVersion.cmake", "lib/cmake/fsdp_cpp/fsdp_cppTargets.cmake"]
        libdir = next((d for d in ("lib", "lib64") if (prefix / d / "libfsdp.a").exists()), None)
        assert libdir, f"no libfsdp.a under {prefix}/lib or lib64"
        missing = [p for p in expected if not (prefix / p).exists()]
        assert not missing, f"not installed: {missing}"
        print(f"installed into {prefix}: {', '.join(expected)}, {libdir}/libfsdp.a")

        missing_dependencies(source, prefix, torch_prefix, Path(tmp))

        outside = Path(tmp) / "minimal"
        run(["cmake", "-S", Path(source) / "examples" / "minimal", "-B", outside, "-G", "Ninja",
             "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_PREFIX_PATH={prefix};{torch_prefix}"])
        run(["cmake", "--build", outside, "-j2"])
        print("examples/minimal built out of tree against the installed package")
        for binary in (outside / "minimal_example", Path(build) / "bin" / "gpt_train", Path(build) / "bin" / "fsdp_plan"):
            assert_cxx_runtime_first(binary)
        print("libstdc++.so.6 before LibTorch in the NEEDED entries of minimal_example, gpt_train and fsdp_plan")

        env = {**os.environ, "OMP_NUM_THREADS": "1", "FSDP_TIMEOUT_SECONDS": "60"}
        out = run([prefix / "bin" / "fsdprun", "--nproc-per-node", "2", outside / "minimal_example"], env=env)
        for rank in (0, 1):
            assert f"[rank{rank}]: rank {rank}: peak tensor memory" in out, f"rank {rank} did not finish:\n{out}"
        print(out.strip())

        against_build = Path(tmp) / "minimal-build-tree"
        run(["cmake", "-S", Path(source) / "examples" / "minimal", "-B", against_build, "-G", "Ninja",
             "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_PREFIX_PATH={build};{torch_prefix}"])
        cache = (against_build / "CMakeCache.txt").read_text()
        found = Path(next(line.split("=", 1)[1] for line in cache.splitlines()
                          if line.startswith("fsdp_cpp_DIR:")))
        assert found.resolve() == Path(build).resolve(), f"fsdp_cpp_DIR is {found}, not the build tree {build}"
        run(["cmake", "--build", against_build, "-j2"])
        out = run([prefix / "bin" / "fsdprun", "--nproc-per-node", "1", against_build / "minimal_example"], env=env)
        assert "[rank0]: rank 0: peak tensor memory" in out or "rank 0: peak tensor memory" in out, out
        print(f"examples/minimal built against the build tree {build} and trained")
    print("install test: OK")


if __name__ == "__main__":
    main(*sys.argv[1:4])
