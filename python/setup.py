"""pip install ./python: builds the hixl and llm_datadist Python packages with
CMake (the whole C++ library underneath) and installs them, self-contained
(libhixl and libllm_datadist travel inside the hixl package).

Offline, with Debian's setuptools, wheel, pybind11 and a C++ toolchain:

    /usr/bin/python3 -m venv --system-site-packages venv
    venv/bin/pip install --no-build-isolation ./python

HIXL_CMAKE_ARGS adds CMake arguments; HIXL_BUILD_JOBS sets the parallelism.
"""
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def project_version():
    for line in (ROOT / "CMakeLists.txt").read_text().splitlines():
        if line.startswith("project(hixl VERSION"):
            return line.split("VERSION")[1].split()[0]
    return "0.0.0"


class CMakeBuild(build_ext):
    """Configures and builds the project's Python targets, then copies the
    package trees CMake laid out into the build directory setuptools packs."""

    def run(self):
        build = Path(self.build_temp).resolve() / "cmake"
        args = [
            "cmake", "-S", str(ROOT), "-B", str(build),
            "-DCMAKE_BUILD_TYPE=Release",
            "-DHIXL_BUILD_PYTHON=ON", "-DHIXL_PYTHON_WHEEL=ON",
            "-DHIXL_BUILD_TESTS=OFF", "-DHIXL_BUILD_TOOLS=OFF",
            f"-DPython3_EXECUTABLE={sys.executable}",
        ] + shlex.split(os.environ.get("HIXL_CMAKE_ARGS", ""))
        subprocess.check_call(args)
        jobs = os.environ.get("HIXL_BUILD_JOBS", str(os.cpu_count() or 2))
        subprocess.check_call(["cmake", "--build", str(build), "-j", jobs,
                               "--target", "hixl_python_wheel_tree"])
        out = Path(self.build_lib).resolve()
        for pkg in ("hixl", "llm_datadist"):
            dst = out / pkg
            dst.mkdir(parents=True, exist_ok=True)
            for f in (build / "python" / pkg).iterdir():
                if f.is_file() and (f.suffix == ".py" or ".so" in f.name):
                    shutil.copy2(f, dst / f.name, follow_symlinks=True)


setup(
    name="hixl",
    version=project_version(),
    description="One-sided KV-cache transfers (hixl) and the LLM-DataDist KV-cache layer",
    packages=["hixl", "hixl.sglang", "llm_datadist", "llm_datadist.vllm_connector"],
    package_dir={"": "."},
    ext_modules=[Extension("hixl._hixl", sources=[]), Extension("llm_datadist._llm_datadist", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    # SGLang's transfer backend plugin (hixl.sglang); the build tree and the
    # CMake-installed tree carry the same file in their dist-info.
    entry_points=(HERE / "entry_points.txt").read_text(),
    python_requires=">=3.9",
    zip_safe=False,
)
