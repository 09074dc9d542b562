"""tools/check_links.py, the docs build's link check (tools/dev.sh docs):
on small sites and Markdown pages, it passes good links and fails each kind
of broken one (a missing file or image, a missing #anchor, a link out of
the site, a malformed external URL, an undefined reference); --online
fetches external URLs (here from a local HTTP server) and counts the ones
it cannot reach as not fetched. The real Markdown pages pass it."""
import functools
import http.server
import importlib.util
import re
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("check_links", ROOT / "tools" / "check_links.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


check_links = _load()


def _write(root, files):
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def _run(capsys, *args):
    rc = check_links.main([str(a) for a in args])
    out = capsys.readouterr().out
    return rc, out


GOOD_SITE = {
    "index.html": """<html><body id="top">
<a href="page.html">page</a> <a href="page.html#sec">section</a> <a href="#top">top</a>
<a href="sub/">folder with index.html</a> <a href="sub/deep.html#x%20y">quoted anchor</a>
<img src="img/logo.png"> <link rel="stylesheet" href="_static/s.css?v=1">
<a href="https://example.org/a?b=c#d">external</a> <a href="mailto:someone@example.org">mail</a>
</body></html>""",
    "page.html": '<h1 id="sec">Section</h1><a href="index.html#top">back</a><a name="old"></a>',
    "sub/index.html": '<a href="../page.html#old">up</a>',
    "sub/deep.html": '<p id="x y">spaced id</p>',
    "img/logo.png": "png",
    "_static/s.css": "",
}


def test_a_good_site_passes_and_its_external_urls_are_counted_as_not_fetched(tmp_path, capsys):
    _write(tmp_path / "site", GOOD_SITE)
    rc, out = _run(capsys, tmp_path / "site")
    assert rc == 0, out
    assert "4 HTML pages" in out and "0 broken" in out
    assert "1 unique external URLs well formed, 1 not fetched" in out
    assert "1 mailto/data/javascript not checked" in out


@pytest.mark.parametrize("link,message", [
    ('<a href="missing.html">', "missing.html does not exist"),
    ('<a href="page.html#nosuch">', "#nosuch is not an anchor of"),
    ('<a href="#nowhere">', "#nowhere is not an anchor of"),
    ('<img src="img/missing.png">', "missing.png does not exist"),
    ('<script src="_static/gone.js"></script>', "gone.js does not exist"),
    ('<a href="../outside.html">', "leads outside"),
    ('<a href="img/">', "is a folder without index.html"),
    ('<a href="https://exa mple.org/">', "external URL has a character"),
    ('<a href="https://:80/">', "external URL has no host"),
    ('<a href="https://example.org:99999/">', "external URL cannot be parsed"),
    ('<a href="https://example_org/">', "external URL has a host name that is not valid"),
    ('<a href="https://examplecom/">', "external URL has a host name without a domain"),
    ('<a href="file:///etc/passwd">', "a file: link"),
])
def test_each_kind_of_broken_link_in_html_fails(tmp_path, capsys, link, message):
    (tmp_path / "outside.html").write_text("")
    _write(tmp_path / "site", dict(GOOD_SITE, **{"bad.html": f"<p>\n{link}\n</p>"}))
    rc, out = _run(capsys, tmp_path / "site")
    assert rc == 1, out
    assert re.search(r"bad\.html:2: .*" + re.escape(message), out), out
    assert "1 broken" in out


GOOD_MD = {
    "README.md": """# Project

See [the guide](docs/guide.md#a-heading), [its second part](docs/guide.md#a-heading-1),
the [reference][ref], [a section](docs/page.rst#getting-started) and
[an explicit target](docs/page.rst#the-target), [the code](src/main.py#L3-L5),
<https://example.org/x> and https://example.com/y. ![logo](img/logo.png)
<img src="img/logo.png" alt="the logo"> [a folder](docs/) [Same page](#more-help)

## More help!

    [indented code](is-not-a-link.md)

```
[fenced code](is-not-a-link-either.md)
```

and `[inline code](nor-this.md)`.

[ref]: docs/guide.md
""",
    "docs/guide.md": "Intro\n\n## A heading\n\ntext\n\n## A heading\n\nAgain\n=====\n",
    "docs/page.rst": ".. _the target:\n\nGetting started\n===============\n\ntext\n",
    "src/main.py": "a = 1\n",
    "img/logo.png": "png",
}


def test_good_markdown_passes(tmp_path, capsys):
    _write(tmp_path, GOOD_MD)
    rc, out = _run(capsys, tmp_path / "README.md", tmp_path / "docs" / "guide.md", "--root", tmp_path)
    assert rc == 0, out
    assert "2 Markdown files" in out and "0 broken" in out
    assert "2 unique external URLs well formed, 2 not fetched" in out


@pytest.mark.parametrize("line,message", [
    ("[a link](docs/missing.md)", "docs/missing.md does not exist"),
    ("[an anchor](docs/guide.md#no-such-heading)", "#no-such-heading is not an anchor of"),
    ("[a third one](docs/guide.md#a-heading-2)", "#a-heading-2 is not an anchor of"),
    ("[a section](docs/page.rst#getting-startd)", "#getting-startd is not an anchor of"),
    ("[same page](#nowhere)", "#nowhere is not an anchor of"),
    ("![an image](img/missing.png)", "img/missing.png does not exist"),
    ('<img src="img/missing.svg">', "img/missing.svg does not exist"),
    ("[text][undefined]", "[undefined]: no link definition gives this label"),
    ("[up](../outside.md)", "leads outside"),
    ("[an anchor in code](src/main.py#main)", "#main: main.py is not a page with anchors"),
    ("see https://host_name.example.org/x", "external URL has a host name that is not valid"),
    ("[spaced](docs/a b.md)", "not a link: a space in its destination"),
])
def test_each_kind_of_broken_link_in_markdown_fails(tmp_path, capsys, line, message):
    _write(tmp_path / "repo", GOOD_MD)
    (tmp_path / "outside.md").write_text("")
    bad = tmp_path / "repo" / "bad.md"
    bad.write_text(f"# Bad\n\n{line}\n")
    rc, out = _run(capsys, bad, "--root", tmp_path / "repo")
    assert rc == 1, out
    assert re.search(r"bad\.md:3: .*" + re.escape(message), out), out
    assert "1 broken" in out


def test_a_missing_input_is_an_error(tmp_path, capsys):
    assert check_links.main([str(tmp_path / "nothing.md")]) == 2
    assert "no such file or folder" in capsys.readouterr().err


def test_github_heading_anchors():
    slug = check_links.github_slug
    assert slug("More help!") == "more-help"
    assert slug("`flow.math` and [links](x.md)") == "flowmath-and-links"
    assert slug("Déjà vu_2 - ok") == "déjà-vu_2---ok"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def local_server(tmp_path):
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "here.html").write_text("ok")
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(tmp_path / "www")))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_online_fetches_external_urls(tmp_path, capsys, local_server):
    page = tmp_path / "page.md"
    page.write_text(f"[here]({local_server}/here.html) [gone]({local_server}/gone.html)\n")
    rc, out = _run(capsys, page, "--root", tmp_path)
    assert rc == 0 and "2 not fetched" in out, out  # offline: the form only
    rc, out = _run(capsys, page, "--root", tmp_path, "--online")
    assert rc == 1, out
    assert "page.md:1: HTTP 404" in out and "/gone.html" in out
    assert "2 fetched, 0 not fetched" in out


def test_online_without_a_network_skips_what_it_cannot_reach(tmp_path, capsys, local_server):
    # A port nothing listens on: the connection is refused, as without a network.
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    page = tmp_path / "page.md"
    page.write_text(f"[nobody](http://127.0.0.1:{port}/x)\n")
    rc, out = _run(capsys, page, "--root", tmp_path, "--online")
    assert rc == 0, out
    assert "none fetched: no network (1 could not be reached)" in out


def test_the_markdown_pages_users_read_pass():
    pages = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert check_links.main([str(p) for p in pages]) == 0


def test_the_docs_build_runs_the_link_check_and_fails_on_it():
    dev = (ROOT / "tools" / "dev.sh").read_text()
    body = dev[dev.index("docs_build() {"):dev.index("\n}\n", dev.index("docs_build() {"))]
    assert re.search(r'tools/check_links\.py build/docs/html README\.md benchmarks/README\.md docs/\*\.md'
                     r' \|\| rc=1', body)
    assert 'rm -rf build/docs/html' in body and "return 1" in body
