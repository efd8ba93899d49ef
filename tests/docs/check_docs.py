#!/usr/bin/env python3
"""The docs check (issue 58): what the Markdown pages show must work.

Usage: check_docs.py --ditrl BUILD/ditrl --root REPO [FILE.md ...]
Without files it checks README.md, docs/*.md, slurm/README.md and tests/README.md under REPO.
Exit status 0 when every check passes; 1 with one line per problem (FILE:LINE: ...), then
"docs check FAILED: N problem(s)".

What is checked, outside fenced code and inline code unless said otherwise:
  links    Every relative link or image ([text](path), [text](path#anchor), [label]: path) names a
           file or folder inside REPO, and every #anchor a heading of that file (or an HTML id= /
           name= there), by GitHub's rules: the heading's text without its Markdown, lower-cased,
           every character but letters, digits, spaces, '-' and '_' dropped, spaces made '-';
           a repeated heading gets -1, -2, ... Links with a scheme (https:, mailto:) are not followed.
  decks    Every ```toml fenced block is checked with `ditrl check --without-files`, by the words
           after "toml" on its fence line:
             ```toml deck      a whole deck: checked as it is;
             ```toml           a deck excerpt (some sections or keys): its keys are set with --set
                               over inputs/quickstart.toml, so it must name real keys with valid
                               values (and leave the quickstart a valid deck);
             ```toml over=D    an excerpt of deck D (a repository path, such as a recipe under
                               inputs/): its keys are set over D;
             ```toml nocheck   TOML that is not a deck: skipped.
  commands In ```sh / ```bash / ```shell / ```console blocks, in fenced blocks with no language, and in
           inline code: every command whose word is `ditrl` (or a path ending in /ditrl, such as
           build/ditrl, anywhere in the command) must name a subcommand that `ditrl --help` lists
           and whose `ditrl SUB [SUBSUB] --help` exits 0, and each --option it shows must be one that
           help lists. Shell comments are prose and not read. A script run by bash, sh, sbatch or
           python (`bash scripts/test.sh`, `sbatch slurm/train.sbatch ...`), or named as the command
           itself with a path (`tools/plot_metrics.py ...`; in inline code only when arguments follow:
           a path alone there names a file), must exist in REPO.
"""
import argparse
import collections
import functools
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
import urllib.parse

DEFAULT_PAGES = ["README.md", "docs/*.md", "slurm/README.md", "tests/README.md"]
EXCERPT_BASE = "inputs/quickstart.toml"
SHELL_LANGUAGES = {"sh", "bash", "shell", "console"}
INTERPRETERS = {"bash", "sh", "sbatch", "python", "python3"}
SCRIPT_SUFFIXES = (".sh", ".sbatch", ".py")


class Report:
    """The problems found, and how many things of each kind were checked (printed, so a check that
    silently matched nothing shows)."""

    def __init__(self):
        self.problems = []
        self.checked = collections.Counter()

    def problem(self, text):
        self.problems.append(text)

    def count(self, kind):
        self.checked[kind] += 1


class Page:
    """A Markdown file split into fenced blocks and the prose between them."""

    FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})(.*)$")

    def __init__(self, path, root):
        self.path = path
        self.name = os.path.relpath(path, root)
        with open(path, encoding="utf-8") as f:
            self.lines = f.read().split("\n")
        self.blocks = []  # (first content line number, info string, content lines)
        self.prose = []  # (line number, text) of lines outside fenced blocks
        self._split()

    def _split(self):
        opening = None  # the open fence: (its character, its length, info string, first content line)
        content = []
        for number, line in enumerate(self.lines, start=1):
            match = self.FENCE.match(line)
            if opening is None:
                if match:
                    opening, content = (match.group(2)[0], len(match.group(2)), match.group(3).strip(), number + 1), []
                else:
                    self.prose.append((number, line))
            elif (match and match.group(2)[0] == opening[0] and len(match.group(2)) >= opening[1]
                  and not match.group(3).strip()):
                self.blocks.append((opening[3], opening[2], content))
                opening = None
            else:
                content.append(line)
        if opening is not None:  # an unclosed fence runs to the end of the file, as GitHub renders it
            self.blocks.append((opening[3], opening[2], content))

    def paragraphs(self):
        """Runs of consecutive prose lines: [(first line number, [lines])]."""
        out, current = [], []
        for number, line in self.prose:
            if line.strip() and current and current[-1][0] == number - 1:
                current.append((number, line))
            elif line.strip():
                if current:
                    out.append(current)
                current = [(number, line)]
            else:
                if current:
                    out.append(current)
                current = []
        if current:
            out.append(current)
        return out


INLINE_CODE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)


def inline_code(page):
    """(line number, code) of every code span, found per paragraph as CommonMark pairs them."""
    spans = []
    for paragraph in page.paragraphs():
        text = "\n".join(line for _, line in paragraph)
        for match in INLINE_CODE.finditer(text):
            line = paragraph[0][0] + text.count("\n", 0, match.start())
            spans.append((line, match.group(2).replace("\n", " ").strip()))
    return spans


def without_code(text):
    """`text` with its code spans blanked out, line breaks kept (so line numbers stay right)."""
    return INLINE_CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


# ---------------------------------------------------------------------------------------------- anchors


def heading_text(markdown):
    """The text GitHub renders for a heading's Markdown: code spans keep their content as it is."""
    parts = re.split(r"(`+[^`]*`+)", markdown)
    for i in range(0, len(parts), 2):  # outside code spans
        text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", parts[i])  # links and images: their text
        text = re.sub(r"<[^>]+>", "", text)  # HTML tags
        parts[i] = re.sub(r"\*+|(?<!\w)_+|_+(?!\w)", "", text)  # emphasis, not intraword underscores
    for i in range(1, len(parts), 2):
        parts[i] = parts[i].strip("`")
    return "".join(parts).strip()


def github_slug(text):
    return "".join(ch for ch in text.lower() if ch.isalnum() or ch in " -_").replace(" ", "-")


@functools.lru_cache(maxsize=None)
def anchors_of(path):
    """Every anchor GitHub makes for the Markdown file at `path`."""
    page = Page(path, os.path.dirname(path))
    anchors, seen = set(), {}
    previous = ""
    for _, line in page.prose:
        atx = re.match(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", line)
        setext = (re.match(r"^ {0,3}(=+|-+)\s*$", line) and previous.strip()
                  and not previous.lstrip().startswith(("|", "-", "*", ">", "#")))
        text = atx.group(2) if atx else previous if setext else None
        if text is not None:
            slug = github_slug(heading_text(text))
            unique = slug if slug not in seen else f"{slug}-{seen[slug]}"
            seen[slug] = seen.get(slug, 0) + 1
            anchors.add(unique)
        for match in re.finditer(r"""<[^>]*\b(?:id|name)\s*=\s*["']([^"']+)["']""", line):
            anchors.add(match.group(1))
        previous = line
    return anchors


# ------------------------------------------------------------------------------------------------ links

INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")


def link_targets(page):
    for paragraph in page.paragraphs():
        text = without_code("\n".join(line for _, line in paragraph))
        for match in INLINE_LINK.finditer(text):
            yield paragraph[0][0] + text.count("\n", 0, match.start()), match.group(1)
        for offset, line in enumerate(text.split("\n")):
            definition = REFERENCE_DEFINITION.match(line)
            if definition:
                yield paragraph[0][0] + offset, definition.group(1)


def check_links(page, root, report):
    for line, target in link_targets(page):
        where = f"{page.name}:{line}"
        report.count("links")
        if not target:
            report.problem(f"{where}: empty link target")
            continue
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
            continue  # a URL: not followed (the check runs without a network)
        path_part, _, anchor = target.partition("#")
        path_part = urllib.parse.unquote(path_part.split("?")[0])
        if path_part:
            base = root if path_part.startswith("/") else os.path.dirname(page.path)
            resolved = os.path.normpath(os.path.join(base, path_part.lstrip("/")))
            if os.path.relpath(resolved, root).startswith(".."):
                report.problem(f"{where}: link '{target}' leaves the repository")
                continue
            if not os.path.exists(resolved):
                report.problem(f"{where}: link '{target}': no such file {os.path.relpath(resolved, root)}")
                continue
        else:
            resolved = page.path
        if anchor and resolved.endswith(".md") and os.path.isfile(resolved):
            if urllib.parse.unquote(anchor) not in anchors_of(resolved):
                report.problem(f"{where}: link '{target}': no heading of {os.path.relpath(resolved, root)} "
                               f"has the anchor #{anchor}")


# ------------------------------------------------------------------------------------------------ decks


def toml_value(value):
    """A value as TOML text, for --set (ditrl parses the value after '=' as TOML)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"no TOML text for {value!r}")


def assignments(table, prefix=""):
    """--set arguments that put every key of `table` into a deck."""
    for key, value in table.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from assignments(value, dotted + ".")
        else:
            yield f"{dotted}={toml_value(value)}"


def check_decks(page, root, ditrl, work, report):
    for first_line, info, content in page.blocks:
        words = info.split()
        if not words or words[0] != "toml" or "nocheck" in words[1:]:
            continue
        where = f"{page.name}:{first_line - 1}"
        report.count("toml blocks")
        text = "\n".join(content) + "\n"
        label = re.sub(r"[^A-Za-z0-9._-]", "_", page.name) + f"-line{first_line - 1}.toml"
        if "deck" in words[1:]:
            deck = os.path.join(work, label)
            with open(deck, "w", encoding="utf-8") as f:
                f.write(text)
            overrides, kind = [], "deck"
        else:
            try:
                excerpt = tomllib.loads(text)
            except tomllib.TOMLDecodeError as e:
                report.problem(f"{where}: toml excerpt is not valid TOML: {e}")
                continue
            base = next((w[len("over="):] for w in words[1:] if w.startswith("over=")), EXCERPT_BASE)
            deck = os.path.join(root, base)
            if not os.path.isfile(deck):
                report.problem(f"{where}: toml excerpt over {base}: no such deck in the repository")
                continue
            overrides, kind = list(assignments(excerpt)), f"excerpt (over {base})"
        command = [ditrl, "check", "--without-files", deck] + [a for o in overrides for a in ("--set", o)]
        result = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            detail = (result.stderr.strip() or result.stdout.strip()).replace("\n", "\n    ")
            report.problem(f"{where}: toml {kind} fails `ditrl check --without-files`:\n    {detail}")


# --------------------------------------------------------------------------------------------- commands


class Cli:
    """What `ditrl ... --help` says, asked once per (sub)command."""

    def __init__(self, ditrl):
        self.ditrl = ditrl

    @functools.lru_cache(maxsize=None)
    def help(self, path):
        """(exit status, help text) of `ditrl PATH... --help`."""
        result = subprocess.run([self.ditrl, *path, "--help"], capture_output=True, text=True, timeout=120)
        return result.returncode, result.stdout + result.stderr

    def subcommands(self, path):
        status, text = self.help(path)
        if status != 0 or "Subcommands:" not in text:
            return set()
        listed = text.split("Subcommands:", 1)[1]
        return set(re.findall(r"^\s{1,4}([a-z][a-z0-9-]*)\s", listed, re.M))

    def options(self, path):
        return set(re.findall(r"(?<![\w-])(--[a-zA-Z0-9][\w-]*)", self.help(path)[1]))


SHELL_OPERATORS = re.compile(r"\|\||&&|[|;&()]|(?<![\w/.-])[<>]\S*")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def simple_commands(text):
    """Token lists of the shell commands in `text` (split at operators; comments dropped)."""
    for line in text.split("\n"):
        line = re.sub(r"(^|\s)#.*$", "", line)
        for part in SHELL_OPERATORS.split(line):
            tokens = part.split()
            if tokens:
                yield tokens


def command_word(tokens):
    for i, token in enumerate(tokens):
        if not ASSIGNMENT.match(token):
            return i
    return len(tokens)


def ditrl_arguments(tokens):
    """The arguments after `ditrl`, or None when the command does not run ditrl."""
    start = command_word(tokens)
    if start < len(tokens) and tokens[start] == "ditrl":
        return tokens[start + 1:]
    for i in range(start, len(tokens)):
        if tokens[i].endswith("/ditrl") and not tokens[i].startswith("$"):
            return tokens[i + 1:]
    return None


def option_name(token):
    return token.strip("[]()'\",").split("=", 1)[0]


def check_ditrl_command(arguments, cli, where, report):
    shown = "ditrl " + " ".join(arguments)
    path = []
    for token in arguments:
        if not re.fullmatch(r"[a-z][a-z0-9-]*", token) or token not in cli.subcommands(tuple(path)):
            break
        path.append(token)
    rest = arguments[len(path):]
    listed = cli.subcommands(tuple(path))
    if listed and rest and re.fullmatch(r"[a-z][a-z0-9-]*", rest[0]):
        report.problem(f"{where}: `{shown}`: {' '.join(['ditrl'] + path)} has no subcommand '{rest[0]}' "
                        f"(`{' '.join(['ditrl'] + path + ['--help'])}` lists {', '.join(sorted(listed))})")
        return
    status, text = cli.help(tuple(path))
    if status != 0:
        report.problem(f"{where}: `{shown}`: `ditrl {' '.join(path + ['--help'])}` exits {status}: "
                       f"{text.strip()[:300]}")
        return
    known = cli.options(tuple(path))
    for token in rest:
        if token.startswith("--") and option_name(token) not in known:
            report.problem(f"{where}: `{shown}`: `ditrl {' '.join(path)}` has no option {option_name(token)} "
                            f"(see `ditrl {' '.join(path + ['--help'])}`)")


def scripts_of(tokens, inline):
    """Repository scripts the command runs: an interpreter's script, or the command word as a path.
    In inline code a path alone names a file rather than runs it (`kit/prefix/env.sh`, another
    project's `scripts/train_sd3.py`): there the command word counts only with arguments."""
    start = command_word(tokens)
    for i in range(start, len(tokens)):
        if os.path.basename(tokens[i]) in INTERPRETERS:
            arguments = [t for t in tokens[i + 1:] if not t.startswith("-")]
            if arguments:
                yield arguments[0]
            break
    if start < len(tokens) and tokens[start].endswith(SCRIPT_SUFFIXES) and (not inline or start + 1 < len(tokens)):
        yield tokens[start]


def repository_path(token):
    return "/" in token and not re.match(r"^[$~/<{]|^build/", token) and not re.search(r"[<>{}*]", token)


def check_commands(page, root, cli, report):
    sources = [(line, code, True) for line, code in inline_code(page)]
    for first_line, info, content in page.blocks:
        words = info.split()
        if not words or words[0] in SHELL_LANGUAGES:
            sources += [(first_line + offset, line, False) for offset, line in enumerate(content)]
    for line, text, inline in sources:
        where = f"{page.name}:{line}"
        for tokens in simple_commands(text):
            arguments = ditrl_arguments(tokens)
            if arguments:
                report.count("ditrl commands")
                check_ditrl_command(arguments, cli, where, report)
            for script in filter(repository_path, scripts_of(tokens, inline)):
                report.count("scripts")
                if not os.path.exists(os.path.join(root, script)):
                    report.problem(f"{where}: `{' '.join(tokens)}` runs {script}, which is not in the repository")


# ------------------------------------------------------------------------------------------------- main


def pages(root, files):
    if files:
        return [os.path.abspath(f) for f in files]
    found = []
    for pattern in DEFAULT_PAGES:
        found += sorted(glob.glob(os.path.join(root, pattern)))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ditrl", required=True, help="the ditrl executable")
    parser.add_argument("--root", required=True, help="the repository root")
    parser.add_argument("files", nargs="*", help="Markdown files (default: the project's pages)")
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    ditrl = os.path.abspath(args.ditrl)
    cli = Cli(ditrl)
    report = Report()
    checked = pages(root, args.files)
    with tempfile.TemporaryDirectory(prefix="ditrl-docs-") as work:
        for path in checked:
            page = Page(path, root)
            check_links(page, root, report)
            check_decks(page, root, ditrl, work, report)
            check_commands(page, root, cli, report)
    for problem in report.problems:
        print(problem)
    names = ", ".join(os.path.relpath(p, root) for p in checked)
    counts = ", ".join(f"{n} {kind}" for kind, n in sorted(report.checked.items()))
    if report.problems:
        print(f"docs check FAILED: {len(report.problems)} problem(s) in {names} ({counts} checked)")
        return 1
    print(f"docs check passed: {names} ({counts or 'nothing'} checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
