#!/usr/bin/env python3
"""The docs' links check (ctest docs_links): every relative link in the project's Markdown guides
points at a file that exists, and every #anchor at a heading of its target.

Usage: check_links.py REPO_ROOT. Prints each broken link and exits 1 if there is one."""
import glob
import os
import re
import sys

GUIDES = ["README.md", "bench/README.md", "docs/*.md", "tests/README.md", "tests/hosts/README.md"]


def without_code_blocks(text):
    return re.sub(r"```.*?```", "", text, flags=re.S)


def github_anchor(heading):
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors_of(path):
    headings = re.findall(r"^#+\s+(.*)$", without_code_blocks(open(path).read()), flags=re.M)
    return {github_anchor(h) for h in headings}


def broken_links(guide):
    for target in re.findall(r"\]\(([^)\s]+)\)", without_code_blocks(open(guide).read())):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(guide), path)) if path else guide
        if not os.path.exists(full):
            yield f"{guide}: {target}: no such file"
        elif anchor and full.endswith(".md") and anchor not in anchors_of(full):
            yield f"{guide}: {target}: no such heading in {full}"


def main(root):
    os.chdir(root)
    guides = sorted({g for pattern in GUIDES for g in glob.glob(pattern)})
    broken = [line for guide in guides for line in broken_links(guide)]
    print("\n".join(broken + [f"docs links: {len(guides)} guides, {len(broken)} broken link(s)"]))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
