"""What a new user reads ([firstcontact], issue #28) says what is true: the
README's first job and the guides' code blocks run, the configuration guide
lists every FLOWJIT_* variable the code reads, every API page is in the
reference's table of contents, the README's links lead to files, and
setup.py hands its commands to the pyproject build."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

# Pages with testcode blocks, each page's blocks run in order in one fresh
# process, as `sphinx -b doctest` runs them (the distributed guide's code
# blocks need several devices or a GPU and are not run).
RUN_PAGES = ["index.rst", "getting-started.rst", "guides/jobs.rst", "guides/training.rst",
             "guides/inspecting.rst"]


def _env(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("FLOWJIT_DEBUG", "FLOWJIT_DUMP_DIR", "FLOWJIT_CPU", "FLOWJIT_PROFILE")}
    env["FLOWJIT_CACHE_DIR"] = str(tmp_path / "cache")
    return env


def _rst_python_blocks(text):
    """The bodies of the page's ``.. testcode::`` directives (the code the docs
    build's doctest builder runs)."""
    blocks = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == ".. testcode::":
            i += 1
            body = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith("   ")):
                body.append(lines[i][3:])
                i += 1
            blocks.append("\n".join(body).strip("\n"))
        else:
            i += 1
    return blocks


def _run(code, tmp_path):
    script = tmp_path / "page.py"
    script.write_text(code)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                          env=_env(tmp_path), cwd=tmp_path)


@pytest.mark.parametrize("page", RUN_PAGES)
def test_the_pages_python_blocks_run(page, tmp_path):
    blocks = _rst_python_blocks((DOCS / page).read_text())
    assert blocks, page
    p = _run("\n\n".join(blocks) + "\n", tmp_path)
    assert p.returncode == 0, (page, p.stdout[-2000:], p.stderr[-3000:])


def test_readme_first_job_prints_what_the_readme_shows(tmp_path):
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"## A first job\n.*?```python\n(.*?)```", readme, re.S).group(1)
    p = _run(code, tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    shown = re.search(r"It prints .*?:\n\n((?:    .*\n)+)", readme).group(1)
    assert p.stdout.splitlines() == [ln[4:] for ln in shown.splitlines()], p.stdout
    # The same job, word for word, in the getting-started page.
    assert code.strip() in "\n".join(_rst_python_blocks((DOCS / "getting-started.rst").read_text()))


def _variables_read_by_the_code():
    """FLOWJIT_* names in string literals of the package and the C++ core
    (os.environ / getenv arguments; macro names are not strings)."""
    names = set()
    files = list((ROOT / "python" / "flowjit").rglob("*.py"))
    for d in ("ir", "jit", "codegen", "runtime", "abi", "python/csrc"):
        files += [f for f in (ROOT / d).rglob("*") if f.suffix in (".cpp", ".h")]
    for f in files:
        names |= set(re.findall(r"[\"'](FLOWJIT_[A-Z0-9_]+)", f.read_text(errors="replace")))
    return names


def test_configuration_guide_lists_every_variable_the_code_reads():
    guide = (DOCS / "guides" / "configuration.rst").read_text()
    read = _variables_read_by_the_code()
    assert {"FLOWJIT_DEBUG", "FLOWJIT_CACHE_DIR", "FLOWJIT_STORE_TOKEN"} <= read
    missing = sorted(v for v in read if f"``{v}``" not in guide)
    assert missing == [], f"add these to docs/guides/configuration.rst: {missing}"


def test_every_api_page_is_in_the_reference_contents():
    reference = (DOCS / "reference.rst").read_text()
    listed = set(re.findall(r"^   api/([\w-]+)$", reference, re.M))
    pages = {p.stem for p in (DOCS / "api").glob("*.rst")}
    assert pages - listed == set(), "list the new page in a toctree of docs/reference.rst"


def test_readme_links_lead_to_files():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#:]+)\)", readme)
    assert "docs/getting-started.rst" in links
    assert [link for link in links if not (ROOT / link).exists()] == []


def test_readme_and_dev_sh_agree_on_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    dev = (ROOT / "tools" / "dev.sh").read_text()
    assert "    tools/dev.sh train\n" in readme and "    tools/dev.sh test\n" in readme
    # What setup installs: every Debian package dev.sh installs is named (the
    # data set by its name, the rest by what they are).
    apt = re.search(r'^APT_PACKAGES="([^"]+)"', dev, re.M).group(1).split()
    setup_text = readme[readme.index("## Two commands"):readme.index("## A first job")]
    said = {"llvm-19-dev": "LLVM 19", "libtbb-dev": "TBB", "libgloo-dev": "Gloo",
            "libturbojpeg0-dev": "libjpeg-turbo", "libpng-dev": "libpng",
            "dataset-fashion-mnist": "dataset-fashion-mnist", "libgtest-dev": "GoogleTest",
            "cmake": "CMake", "ninja-build": "Ninja", "ccache": "ccache", "g++": "g++",
            "python3-dev": None, "clang-format-19": "clang-format 19", "openmpi-bin": "Open MPI"}
    assert set(apt) == set(said), "a package was added to dev.sh: say it in the README"
    assert [p for p, word in said.items() if word and word not in setup_text] == []
    install_pip = dev[dev.index("install_pip()"):dev.index("\n}", dev.index("install_pip()"))]
    pip = re.findall(r'"?([a-z][\w-]*)(?:[<>=][^"\s]*)?"?(?= |\\|$)',
                     install_pip.split("--disable-pip-version-check", 2)[2])
    assert {"numpy", "pybind11", "scikit-build-core", "pytest"} <= set(pip), pip
    assert [pkg for pkg in pip if pkg not in setup_text] == [], "say the new package in the README"
    # What test runs: each suite run_tests runs is named.
    run_tests = dev[dev.index("run_tests()"):dev.index("# ---", dev.index("run_tests()"))]
    suites = re.findall(r'run_suite "([^"]+)"', run_tests)
    assert suites[:3] == ["lint", "docs (sphinx -W)", "ctest"], suites
    for word in ("lint", "docs build", "ctest", "pytest", "vector", "slow end-to-end training"):
        assert word in setup_text, word


def _setup(*args):
    return subprocess.run([sys.executable, str(ROOT / "setup.py"), *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


def test_setup_py_hands_commands_to_the_pyproject_build():
    p = _setup("--help")
    assert p.returncode == 0 and "scikit-build-core" in p.stdout and "pip install ." in p.stdout
    version = re.search(r'__version__ = "([^"]+)"', (ROOT / "python" / "flowjit" / "_version.py").read_text())
    assert _setup("--version").stdout.strip() == version.group(1)
    p = _setup("install", "--dry-run")
    assert p.returncode == 0 and p.stdout.strip() == f"+ {sys.executable} -m pip install {ROOT}"
    p = _setup("bdist_wheel", "-n")
    assert p.returncode == 0 and f"-m pip wheel --no-deps -w {ROOT / 'dist'} {ROOT}" in p.stdout
    p = _setup("develop", "-n")
    assert p.returncode == 0 and p.stdout.strip().endswith(f"pip install -e {ROOT}")
    p = _setup("upload")
    assert p.returncode == 2 and "not a command here" in p.stderr
    # The build it hands to is pyproject.toml's.
    assert 'build-backend = "scikit_build_core.build"' in (ROOT / "pyproject.toml").read_text()


def test_benchmarks_readme_opens_with_a_current_table_per_host_kind():
    text = (ROOT / "benchmarks" / "README.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)
    titles = [s.split("\n", 1)[0] for s in sections[1:]]
    assert titles[:2] == ["Current results: AVX-512 host", "Current results: AVX2 host"], titles
    assert {"Method", "Peers"} <= set(titles)
    for body in sections[1:3]:
        head = body[:1200]
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", head), head          # its date
        assert re.search(r"\bmain at [0-9a-f]{7,}\b", head), head      # its commit
        assert re.search(r"2\sCPUs", head) and re.search(r"^\| case .*\|$", body, re.M)
    # No run-by-run history, no paths of the machines it ran on.
    assert not re.search(r"session \d|issue \d", text, re.I)
    assert not re.search(r"/work/|/home/", text)
