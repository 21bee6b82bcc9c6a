#!/usr/bin/env python3
"""Check every relative link and anchor of the repository's Markdown.

    docs/check-links.py                 README.md, BENCHMARKS.md and docs/**/*.md
    docs/check-links.py FILE...         only these files
    docs/check-links.py --self-test     show that a planted broken link fails

For each inline link or image `[text](target)` and each reference definition
`[id]: target` outside code (fenced blocks, indented blocks, `code spans`):

- a target with a scheme (https:, mailto:) is not fetched (no network);
- a relative path must name a file or folder inside the repository (a link
  that leaves it cannot be opened by a reader of the repository);
- an anchor (`#part`) must be a heading of the target Markdown file, as
  GitHub renders heading slugs: the heading's text in lower case, every
  character that is not a letter, digit, `_`, `-` or space dropped, each
  space made `-`, and a second heading of the same slug given `-1`, a third
  `-2` (github-slugger, which github.com uses). `<a id=...>`/`<a name=...>`
  count too. A source file's anchor must be a line (`#L10`, `#L10-L20`).

Prints one line per broken link, `FILE:LINE: TARGET: reason`, and exits 1
when there is any; 0 and a summary otherwise. Standard library only.
"""

import os
import re
import sys
import tempfile
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target "title") and ![alt](target); text may hold one level of brackets.
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s)]+)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(\S+)")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
LINE_ANCHOR = re.compile(r"^L\d+(-L\d+)?$")


def prose_lines(text):
    """(line number, line) for the lines outside code blocks, code spans removed,
    and the code lines as None, so that headings and links are found only in prose."""
    out = []
    fence = None
    previous_blank = True
    in_indented = False
    for number, line in enumerate(text.split("\n"), 1):
        if fence:
            match = FENCE.match(line)
            if match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence):
                fence = None
            out.append((number, None))
            continue
        match = FENCE.match(line)
        if match:
            fence = match.group(1)
            out.append((number, None))
            previous_blank = False
            continue
        blank = line.strip() == ""
        indented = line.startswith("    ") or line.startswith("\t")
        if not blank and indented and (previous_blank or in_indented):
            in_indented = True
            out.append((number, None))
            continue
        if not blank:
            in_indented = False
        previous_blank = blank
        out.append((number, CODE_SPAN.sub(lambda m: "\x00" * len(m.group(0)), line)))
    return out


def heading_text(raw):
    """The text GitHub renders for a heading's source: code spans keep their
    content, links their text, emphasis markers go."""
    text = CODE_SPAN.sub(lambda m: m.group(2).strip(), raw)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    return text.replace("*", "").strip()


def slug(text):
    out = []
    for ch in text.lower():
        if ch in " -_" or ch.isalnum() or unicodedata.category(ch)[0] == "M":
            out.append("-" if ch == " " else ch)
    return "".join(out)


def anchors(path, cache={}):
    """Every anchor GitHub gives the Markdown file at path."""
    if path in cache:
        return cache[path]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    seen = {}
    found = set()
    lines = prose_lines(text)
    raw_lines = text.split("\n")
    for index, (number, line) in enumerate(lines):
        if line is None:
            continue
        title = None
        match = ATX.match(raw_lines[number - 1])
        if match:
            title = re.sub(r"[ \t]+#+[ \t]*$", "", match.group(2) or "")
        elif index + 1 < len(lines) and lines[index + 1][1] is not None and line.strip() \
                and not line.lstrip().startswith(("|", "-", "*", ">")) \
                and SETEXT.match(raw_lines[lines[index + 1][0] - 1]):
            title = raw_lines[number - 1].strip()
        if title is not None:
            base = slug(heading_text(title))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
        for html in HTML_ANCHOR.finditer(line):
            found.add(html.group(1))
    cache[path] = found
    return found


def links(path):
    """(line number, target) of every link in the prose of the file at path."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for number, line in prose_lines(text):
        if line is None:
            continue
        for match in INLINE.finditer(line):
            yield number, match.group(1).strip("<>")
        match = REFERENCE.match(line)
        if match:
            yield number, match.group(1).strip("<>")


def check(path, root):
    """The broken links of one file, as (line, target, reason)."""
    broken = []
    count = 0
    for number, target in links(path):
        count += 1
        if SCHEME.match(target) or target.startswith("//"):
            continue
        name, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), name)) if name else path
        if os.path.relpath(resolved, root).startswith(".."):
            broken.append((number, target, "outside the repository"))
            continue
        if not os.path.exists(resolved):
            broken.append((number, target, "no such file"))
            continue
        if not anchor:
            continue
        if resolved.endswith(".md") and os.path.isfile(resolved):
            if anchor not in anchors(resolved):
                broken.append((number, target, f"no heading with the anchor #{anchor} in {os.path.relpath(resolved, root)}"))
        elif not (os.path.isfile(resolved) and LINE_ANCHOR.match(anchor)):
            broken.append((number, target, "an anchor into a file that is not Markdown must be a line (#L10)"))
    return count, broken


def run(files, root, out=sys.stdout):
    total = 0
    failures = 0
    for path in files:
        count, broken = check(path, root)
        total += count
        for number, target, reason in broken:
            failures += 1
            print(f"{os.path.relpath(path, root)}:{number}: {target}: {reason}", file=out)
    return total, failures


def default_files(root):
    """README.md, BENCHMARKS.md and every Markdown file under docs/, its
    subfolders (docs/protocol/, docs/operations/) included."""
    docs = os.path.join(root, "docs")
    found = []
    for folder, subfolders, names in os.walk(docs):
        subfolders.sort()
        found += [os.path.join(folder, n) for n in sorted(names) if n.endswith(".md")]
    return [os.path.join(root, "README.md"), os.path.join(root, "BENCHMARKS.md")] + sorted(found)


def self_test():
    """A good link of each kind passes, and each kind of broken link fails."""
    with tempfile.TemporaryDirectory() as root:
        os.mkdir(os.path.join(root, "docs"))
        with open(os.path.join(root, "docs", "a.md"), "w") as f:
            f.write("# Restarts, upgrades and crashes: what survives what\n\n"
                    "## `[cluster]` keys\n\n## Logs\n\n## Logs\n\nSetext title\n---\n\n"
                    "    [not a link](missing.md)\n\n```\n# not a heading\n```\n")
        with open(os.path.join(root, "x.c"), "w") as f:
            f.write("int x;\n")
        good = ("[a](docs/a.md#restarts-upgrades-and-crashes-what-survives-what) [b](docs/a.md#cluster-keys) "
                "[c](docs/a.md#logs-1) [d](docs/a.md#setext-title) [e](x.c#L1) [f](https://example.com/x) "
                "`[g](missing.md)` [h](docs/)\n")
        bad = ["[a](docs/missing.md)", "[b](docs/a.md#no-such-part)", "[c](docs/a.md#logs-2)",
               "[d](../outside.md)", "[e](x.c#top)", "[f](#not-a-heading-either)", "[g]: docs/nothing.md"]
        with open(os.path.join(root, "README.md"), "w") as f:
            f.write(good + "\n" + "\n\n".join(bad) + "\n")
        sink = open(os.devnull, "w")
        total, failures = run([os.path.join(root, "README.md")], root, out=sink)
        sink.close()
        if failures != len(bad) or total != 8 + len(bad) - 1:
            print(f"check-links self-test: expected {len(bad)} broken of {8 + len(bad) - 1} links, "
                  f"found {failures} broken of {total}", file=sys.stderr)
            return 1
        run([os.path.join(root, "README.md")], root)
    print(f"check-links self-test: the {len(bad)} planted broken links above were found, the good ones passed")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    files = [os.path.abspath(a) for a in argv[1:]] or default_files(ROOT)
    total, failures = run(files, ROOT)
    names = ", ".join(os.path.relpath(f, ROOT) for f in files)
    if failures:
        sys.stdout.flush()
        print(f"check-links: {failures} broken of {total} links in {names}", file=sys.stderr)
        return 1
    print(f"check-links: all {total} links resolve ({names})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
