"""Nested Python environments that see the packages of the environment running the tests.

Some tests install something into a throwaway environment (a loop package, pre-commit's
hook environment) and need loopdsl's dependencies there without a download. A venv made
with `--system-site-packages` sees the *base* interpreter's packages, which is right only
when the tests run on the system interpreter: from a venv or a conda environment it sees
the wrong (often empty) set. Instead the nested environment gets a hook that adds the
site-packages folders of the interpreter running the tests (`site.addsitedir`, so their
.pth files, editable installs among them, are honoured) after its own, so whatever is
installed into the nested environment still comes first.
"""
from __future__ import annotations

import site
import subprocess
import sys
import sysconfig
from pathlib import Path


def outer_site_dirs() -> list[str]:
    """The site-packages folders of the interpreter running the tests, in its own order."""
    found = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        found.append(site.getusersitepackages())
    found += [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    return [d for d in dict.fromkeys(found) if Path(d).is_dir()]


def site_hook_code() -> str:
    """One line of Python that appends the outer site-packages folders (not already there)."""
    # No comprehension: site.py execs the line with its own locals, which a nested scope cannot see.
    return ("import site, sys; list(map(site.addsitedir, "
            f"filter(lambda d, known=sys.path: d not in known, {outer_site_dirs()!r})))")


def make_venv(target: Path) -> str:
    """A fresh venv (no system site-packages) that also sees the outer packages; its python.

    Made `--without-pip`: installing pip into each venv costs seconds of CPU, and the outer
    packages (which hold the pip that installed the suite's dependencies) bring it anyway.
    `python -m pip` in the venv runs that pip under the venv's interpreter, so it installs
    into the venv.
    """
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)],
                          capture_output=True, text=True, check=False)
    if made.returncode != 0:
        raise RuntimeError(f"python -m venv failed: {made.stderr}")
    return expose_outer(target)


def expose_outer(venv: Path) -> str:
    """Let an existing venv see the outer packages after its own; its python."""
    python = str(venv / ("Scripts" if sys.platform == "win32" else "bin") / "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # A .pth line starting with `import` is executed at start-up; the venv's own site-packages
    # is already on sys.path then, so its packages stay first.
    (Path(purelib) / "zz_outer_site.pth").write_text(site_hook_code() + "\n", encoding="utf-8")
    return python


def sitecustomize_dir(target: Path) -> Path:
    """A folder with a sitecustomize.py doing the same, for PYTHONPATH of tools that make their
    own virtualenvs (pre-commit)."""
    target.mkdir(parents=True, exist_ok=True)
    (target / "sitecustomize.py").write_text(
        '"""Appends the test runner\'s site-packages (tests/outer_env.py)."""\n' + site_hook_code() + "\n",
        encoding="utf-8")
    return target


if __name__ == "__main__":  # `python outer_env.py VENV`: what tests/test_docs_shell.py adds to `python -m venv`
    expose_outer(Path(sys.argv[1]))
