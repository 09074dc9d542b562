#!/usr/bin/env python3
"""Checks the links of the built documentation and of the Markdown pages
users read, without a network (run by tools/dev.sh docs after the HTML build).

    tools/check_links.py                     build/docs/html, README.md,
                                             benchmarks/README.md, docs/*.md
    tools/check_links.py PATH... [--root DIR] [--online]

A PATH is a folder of built HTML (every *.html under it, which may link
only inside it), an .html file, or a Markdown file (which may link anywhere
inside --root, the repository by default). What is checked:

- every relative link and image (href, src; Markdown's [text](dest),
  ![alt](src), [text][label] and its definition, <a href>/<img src>) leads
  to a file or folder that exists;
- every #anchor exists in its target: an id (or <a name>) of an HTML page,
  a heading of a Markdown page (GitHub's anchor names), a section title or
  an explicit target of a reStructuredText page; #L12 and #L12-L20 into
  other files (GitHub's line anchors) are accepted;
- every external http(s) URL is well formed (scheme, host, port). External
  URLs are not fetched: the output says how many were left unfetched.
  --online fetches each one once (urllib); a URL that cannot be reached at
  all (no network, no name resolution) is counted as not fetched, not as
  broken, and an HTTP error status is broken.

Prints each problem as FILE:LINE: message, then one summary line; exits 1
when there is a problem, 2 when an input does not exist.
"""
import argparse
import html.parser
import ipaddress
import os
import re
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Attributes that load or lead to another resource, per tag.
LINK_ATTRS = {"a": ("href",), "area": ("href",), "link": ("href",), "img": ("src",), "script": ("src",),
              "iframe": ("src",), "source": ("src",), "embed": ("src",), "video": ("src", "poster"),
              "audio": ("src",), "track": ("src",)}
# Schemes that name no file and no web page: counted, not checked.
UNCHECKED_SCHEMES = {"mailto", "tel", "javascript", "data"}
# Characters that may not appear unescaped in a URL (RFC 3986 leaves them out).
BAD_URL_CHARS = re.compile(r'[\s<>"{}|\\^`\x00-\x1f\x7f]')
HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
LINE_ANCHOR = re.compile(r"^L\d+(-L\d+)?$")


class Link:
    __slots__ = ("source", "line", "url")

    def __init__(self, source, line, url):
        self.source, self.line, self.url = source, line, url


# ---------------------------------------------------------------- HTML

class _HtmlScan(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids, self.links = set(), []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("name"):
            self.ids.add(attrs["name"])
        for attr in LINK_ATTRS.get(tag, ()):
            if attrs.get(attr) is not None:
                self.links.append((self.getpos()[0], attrs[attr].strip()))

    handle_startendtag = handle_starttag


def scan_html(path):
    """(anchors, [(line, url)]) of an HTML page."""
    p = _HtmlScan()
    p.feed(path.read_text(encoding="utf-8", errors="replace"))
    p.close()
    return p.ids, p.links


# ---------------------------------------------------------------- Markdown

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
LIST_ITEM = re.compile(r"^ {0,3}([-*+]|\d{1,9}[.)])(\s|$)")
ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:\s+(.*?))?(?:\s+#+)?\s*$")
SETEXT_UNDERLINE = re.compile(r"^ {0,3}(=+|-+)\s*$")
REF_DEF = re.compile(r"^ {0,3}\[([^\]]+)\]:\s*(<[^>]*>|\S+)")
REF_USE = re.compile(r"\]\[([^\]]*)\]")
AUTOLINK = re.compile(r"<((?:https?|mailto|ftp):[^\s<>]*)>", re.I)
BARE_URL = re.compile(r"(?<![\w(<\"'=/])https?://[^\s<>\"'\]]+", re.I)
HTML_ATTR = re.compile(r"<(a|img|source|iframe|video|audio)\b[^>]*?\b(href|src)\s*=\s*(\"[^\"]*\"|'[^']*')",
                       re.I)
HTML_ID = re.compile(r"<[a-z][^>]*?\b(?:id|name)\s*=\s*(\"[^\"]*\"|'[^']*')", re.I)
HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)


def _blank_code_spans(line):
    """The line with its inline code spans (`...`, ``...``) replaced by
    spaces, so that columns and the rest of the line stay as they were."""
    out, i = [], 0
    while i < len(line):
        if line[i] != "`":
            out.append(line[i])
            i += 1
            continue
        j = i
        while j < len(line) and line[j] == "`":
            j += 1
        ticks = line[i:j]
        end = line.find(ticks, j)
        while end != -1 and end + len(ticks) < len(line) and line[end + len(ticks)] == "`":
            end = line.find(ticks, end + len(ticks) + 1)
        if end == -1:
            out.append(ticks)
            i = j
        else:
            out.append(" " * (end + len(ticks) - i))
            i = end + len(ticks)
    return "".join(out)


def markdown_text_lines(text):
    """[(line number, text)] of the lines of a Markdown page that are prose:
    fenced and indented code blocks and HTML comments are left out, and
    inline code spans are blanked."""
    text = HTML_COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    out, fence, in_list, prev_blank, in_indented = [], None, False, True, False
    for n, line in enumerate(text.splitlines(), 1):
        if fence:
            m = FENCE.match(line)
            closing = m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence)
            if closing and not line[m.end():].strip():
                fence = None
            continue
        m = FENCE.match(line)
        if m:
            fence = m.group(1)
            continue
        blank = not line.strip()
        indent = len(line) - len(line.lstrip(" "))
        if not blank and indent >= 4 and not in_list and (prev_blank or in_indented):
            in_indented = True  # an indented code block
            prev_blank = False
            continue
        if not blank:
            in_indented = False
            if LIST_ITEM.match(line):
                in_list = True
            elif indent < 2 and prev_blank:
                in_list = False
        prev_blank = blank
        out.append((n, _blank_code_spans(line)))
    return out


def _destination(text, start):
    """The link destination that begins at text[start] (after "](") and the
    index after it: <...>, or a run without spaces whose parentheses
    balance."""
    if start < len(text) and text[start] == "<":
        end = text.find(">", start)
        return (text[start + 1:end], end + 1) if end != -1 else (None, start)
    depth, i = 0, start
    while i < len(text) and not text[i].isspace():
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                break
            depth -= 1
        i += 1
    return text[start:i], i


def github_slug(heading):
    """The anchor GitHub gives a Markdown heading (before duplicates get -1,
    -2, ...): its text without markup, lower-cased, punctuation other than
    - and _ dropped, spaces turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.replace("`", "")
    return "".join(c for c in text.lower() if c.isalnum() or c in "-_ ").replace(" ", "-")


def scan_markdown(path):
    """(anchors, [(line, url)], [(line, message)]) of a Markdown page: the
    problems are references to a label no definition gives."""
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = markdown_text_lines(text)
    anchors, links, problems, counts = set(), [], [], {}
    definitions = {}
    previous = None
    for n, line in lines:
        m = REF_DEF.match(line)
        if m:
            definitions[m.group(1).strip().lower()] = (n, m.group(2).strip("<>"))
            previous = None
            continue
        heading = None
        m = ATX_HEADING.match(line)
        if m:
            heading = m.group(2) or ""
        elif previous and previous[1].strip() and SETEXT_UNDERLINE.match(line) and \
                previous[0] == n - 1 and not LIST_ITEM.match(previous[1]):
            heading = previous[1].strip()
        if heading is not None:
            slug = github_slug(heading)
            k = counts.get(slug, 0)
            counts[slug] = k + 1
            anchors.add(slug if k == 0 else f"{slug}-{k}")
        for m in HTML_ID.finditer(line):
            anchors.add(m.group(1)[1:-1])
        rest = list(line)
        for m in re.finditer(r"\]\(", line):
            dest, end = _destination(line, m.end())
            if dest is not None and dest:
                after = line[end:].lstrip()
                if after and after[0] not in ")\"'(":
                    problems.append((n, f"[...]({dest} {after.split()[0]}: not a link: a space in its "
                                        "destination (write %20, or <...> around it)"))
                    continue
                links.append((n, dest))
                rest[m.end():end] = " " * (end - m.end())
        for m in HTML_ATTR.finditer(line):
            links.append((n, m.group(3)[1:-1]))
            rest[m.start(3):m.end(3)] = " " * (m.end(3) - m.start(3))
        for m in AUTOLINK.finditer(line):
            links.append((n, m.group(1)))
            rest[m.start():m.end()] = " " * (m.end() - m.start())
        for m in REF_USE.finditer(line):
            label = m.group(1)
            if not label:  # [label][]: the label is the text before
                start = line.rfind("[", 0, m.start())
                label = line[start + 1:m.start()] if start != -1 else ""
            links.append((n, ("ref", label.strip().lower())))
        for m in BARE_URL.finditer("".join(rest)):
            links.append((n, m.group(0).rstrip(".,;:!?*_")))
        previous = (n, line)
    resolved = []
    for n, url in links:
        if isinstance(url, tuple):
            if url[1] not in definitions:
                problems.append((n, f"[{url[1]}]: no link definition gives this label"))
            continue
        resolved.append((n, url))
    resolved += [(n, url) for n, url in definitions.values()]
    return anchors, sorted(resolved), problems


# ---------------------------------------------------------------- reStructuredText

def docutils_id(text):
    """The id docutils gives a section title or a target name: lower case,
    every run of other characters than letters and digits one hyphen."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def scan_rst_anchors(path):
    """The ids of a reStructuredText page's sections and explicit targets
    (for Markdown links into .rst pages, which GitHub renders)."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    anchors = set()
    for i, line in enumerate(lines):
        m = re.match(r"^\.\. _([^:]+):", line)
        if m:
            anchors.add(docutils_id(m.group(1)))
        if i and line and len(set(line)) == 1 and not line[0].isalnum() and not line[0].isspace() and \
                lines[i - 1].strip() and len(line) >= len(lines[i - 1].rstrip()) >= 1 and \
                not (len(set(lines[i - 1].strip())) == 1 and not lines[i - 1].strip()[0].isalnum()):
            anchors.add(docutils_id(lines[i - 1].strip()))
    return anchors


# ---------------------------------------------------------------- checking

def external_url_problem(url):
    """Why an http(s) URL is not well formed, or None."""
    if BAD_URL_CHARS.search(url):
        return "has a character a URL may not contain unescaped (space, quote, <, >, ...)"
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as e:
        return f"cannot be parsed ({e})"
    host = parts.hostname
    if not host:
        return "has no host"
    if port == 0:
        return "has port 0"
    if parts.netloc.endswith(":"):
        return "has an empty port"
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    try:
        host = host.encode("idna").decode("ascii")
    except UnicodeError:
        return f"has a host name that is not valid: {host!r}"
    labels = host.rstrip(".").split(".")
    if not all(HOST_LABEL.match(label) for label in labels):
        return f"has a host name that is not valid: {host!r}"
    if len(labels) < 2 and host != "localhost":
        return f"has a host name without a domain: {host!r}"
    return None


class Checker:
    def __init__(self, root):
        self.root = root.resolve()
        self.problems = []  # (source, line, message)
        self.anchor_cache = {}
        self.external = {}  # url -> first Link
        self.counts = {"pages_html": 0, "pages_md": 0, "links": 0, "relative": 0, "anchors": 0,
                       "external": 0, "unchecked": 0}

    def problem(self, link, message):
        self.problems.append((link.source, link.line, f"{message}: {link.url}"))

    def anchors_of(self, path):
        path = path.resolve()
        if path not in self.anchor_cache:
            suffix = path.suffix.lower()
            if suffix in (".html", ".htm"):
                self.anchor_cache[path] = scan_html(path)[0]
            elif suffix in (".md", ".markdown"):
                self.anchor_cache[path] = scan_markdown(path)[0]
            elif suffix == ".rst":
                self.anchor_cache[path] = scan_rst_anchors(path)
            else:
                self.anchor_cache[path] = None
        return self.anchor_cache[path]

    def check_anchor(self, link, target, fragment):
        self.counts["anchors"] += 1
        anchors = self.anchors_of(target)
        if anchors is None:
            if not LINE_ANCHOR.match(fragment):
                self.problem(link, f"#{fragment}: {target.name} is not a page with anchors")
        elif fragment not in anchors:
            self.problem(link, f"#{fragment} is not an anchor of {self.show(target)}")

    def show(self, path):
        try:
            return os.path.relpath(path)
        except ValueError:
            return str(path)

    def check_link(self, link, site_root, index_names):
        self.counts["links"] += 1
        url = link.url
        try:
            parts = urllib.parse.urlsplit(url)
        except ValueError as e:
            self.problem(link, f"cannot be parsed ({e})")
            return
        scheme = parts.scheme.lower()
        if scheme in ("http", "https") or (not scheme and url.startswith("//")):
            self.counts["external"] += 1
            why = external_url_problem(url if scheme else "https:" + url)
            if why:
                self.problem(link, f"external URL {why}")
            else:
                self.external.setdefault(urllib.parse.urldefrag(url if scheme else "https:" + url)[0], link)
            return
        if scheme in UNCHECKED_SCHEMES:
            self.counts["unchecked"] += 1
            return
        if scheme:
            self.problem(link, f"a {scheme}: link (only relative links and http(s) URLs can lead anywhere "
                               "for a reader)")
            return
        self.counts["relative"] += 1
        path = urllib.parse.unquote(parts.path)
        fragment = urllib.parse.unquote(parts.fragment)
        source = link.source.resolve()
        if not path:
            target = source
        elif path.startswith("/"):
            target = site_root / path.lstrip("/")
        else:
            target = source.parent / path
        target = Path(os.path.normpath(target))
        if target != site_root and site_root not in target.parents:
            self.problem(link, f"leads outside {self.show(site_root)}")
            return
        if not target.exists():
            self.problem(link, f"{self.show(target)} does not exist")
            return
        if target.is_dir():
            found = [target / n for n in index_names if (target / n).is_file()]
            if not found:
                if fragment or index_names == ("index.html",):
                    self.problem(link, f"{self.show(target)} is a folder without {' or '.join(index_names)}")
                return
            target = found[0]
        if fragment:
            self.check_anchor(link, target, fragment)

    def check_html_page(self, path, site_root):
        self.counts["pages_html"] += 1
        anchors, links = scan_html(path)
        self.anchor_cache[path.resolve()] = anchors
        for line, url in links:
            self.check_link(Link(path, line, url), site_root, ("index.html",))

    def check_markdown_page(self, path):
        self.counts["pages_md"] += 1
        anchors, links, problems = scan_markdown(path)
        self.anchor_cache[path.resolve()] = anchors
        for line, message in problems:
            self.problems.append((path, line, message))
        for line, url in links:
            self.check_link(Link(path, line, url), self.root, ("README.md", "index.md"))

    def check_paths(self, paths):
        for p in paths:
            if p.is_dir():
                site = p.resolve()
                for page in sorted(p.rglob("*.html")):
                    self.check_html_page(page, site)
            elif p.suffix.lower() in (".html", ".htm"):
                self.check_html_page(p, p.resolve().parent)
            else:
                self.check_markdown_page(p)

    def fetch_external(self, timeout=10.0):
        """Fetches each external URL once: (fetched, not reachable)."""
        fetched = unreachable = 0
        for url, link in sorted(self.external.items()):
            status = _fetch(url, timeout)
            if isinstance(status, int):
                fetched += 1
                if status >= 400:
                    self.problem(link, f"HTTP {status}")
            else:
                unreachable += 1
        return fetched, unreachable


def _fetch(url, timeout):
    """The HTTP status of url (HEAD, or GET where HEAD is refused), or the
    reason it could not be reached."""
    headers = {"User-Agent": "flowjit-check-links/1"}
    for method in ("HEAD", "GET"):
        req = urllib.request.Request(url, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status
        except urllib.error.HTTPError as e:
            if method == "HEAD" and e.code in (403, 405, 501):
                continue
            return e.code
        except (urllib.error.URLError, socket.timeout, OSError) as e:
            return str(getattr(e, "reason", e))
    return "unreachable"


def default_paths():
    return [ROOT / "build" / "docs" / "html", ROOT / "README.md", ROOT / "benchmarks" / "README.md",
            *sorted((ROOT / "docs").glob("*.md"))]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", type=Path,
                    help="folders of built HTML, .html or Markdown files (default: the built docs, "
                         "README.md, benchmarks/README.md, docs/*.md)")
    ap.add_argument("--root", type=Path, default=ROOT,
                    help="the folder Markdown links may lead into, and what /path means in them "
                         "(default: the repository)")
    ap.add_argument("--online", action="store_true", help="also fetch every external URL once")
    args = ap.parse_args(argv)
    paths = args.paths or default_paths()
    missing = [p for p in paths if not p.exists()]
    if missing:
        print(f"check_links: no such file or folder: {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    checker = Checker(args.root)
    checker.check_paths(paths)
    unique = len(checker.external)
    if args.online and unique:
        fetched, unreachable = checker.fetch_external()
        if fetched == 0:
            external = (f"{unique} unique external URLs well formed, none fetched: no network "
                        f"({unreachable} could not be reached)")
        else:
            external = (f"{unique} unique external URLs: {fetched} fetched, {unreachable} not fetched "
                        "(could not be reached)")
    else:
        external = (f"{unique} unique external URLs well formed, {unique} not fetched"
                    + (" (offline check; --online fetches them)" if unique else ""))
    for source, line, message in sorted(checker.problems, key=lambda p: (str(p[0]), p[1])):
        print(f"{checker.show(source)}:{line}: {message}")
    c = checker.counts
    print(f"check_links: {c['pages_html']} HTML pages and {c['pages_md']} Markdown files, "
          f"{c['links']} links: "
          f"{c['relative']} relative ({c['anchors']} with an anchor) checked, {c['external']} external "
          f"({external}), {c['unchecked']} mailto/data/javascript not checked; "
          f"{len(checker.problems)} broken")
    return 1 if checker.problems else 0


if __name__ == "__main__":
    sys.exit(main())
