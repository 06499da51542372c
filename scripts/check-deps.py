#!/usr/bin/env python3
"""The light path of `cargo deny check licenses bans`, for machines without
cargo-deny (installing it costs ~5 minutes of the test budget).

Reads the same deny.toml: every package's license expression must be
satisfiable from [licenses].allow, and no crate may appear in two versions
unless [bans].skip names that version. Uses only cargo itself
(`cargo tree`) and the Python standard library.
Exit status 1 with one line per finding; 0 when clean.
"""
import re
import subprocess
import sys
import tomllib

def run(args):
    out = subprocess.run(args, check=True, capture_output=True, text=True)
    return out.stdout


def license_ok(expr, allowed):
    """Evaluates an SPDX expression (OR, AND, WITH, parentheses; the legacy
    "A/B" spelling is OR) against the allowed identifiers."""
    tokens = re.findall(r"\(|\)|[^\s()]+", expr.replace("/", " OR "))
    pos = 0

    def peek():
        return tokens[pos] if pos < len(tokens) else None

    def take():
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def atom():
        if peek() == "(":
            take()
            v = either()
            if take() != ")":
                raise ValueError(f"unbalanced parentheses in {expr!r}")
            return v
        ident = take()
        if peek() == "WITH":
            take()
            ident = f"{ident} WITH {take()}"
        return ident in allowed

    def both():
        v = atom()
        while peek() == "AND":
            take()
            v = atom() and v
        return v

    def either():
        v = both()
        while peek() == "OR":
            take()
            v = both() or v
        return v

    result = either()
    if peek() is not None:
        raise ValueError(f"cannot parse license {expr!r}")
    return result


def main():
    with open("deny.toml", "rb") as f:
        cfg = tomllib.load(f)
    allowed = set(cfg["licenses"]["allow"])
    skip = {s["crate"] for s in cfg["bans"].get("skip", [])}
    problems = []
    host = re.search(r"^host: (\S+)$", run(["rustc", "-vV"]), re.M)
    # What ships: normal and build dependencies on this host, as cargo-deny
    # sees them (dev-only tools such as cbindgen and proptest are left out).
    tree = ["cargo", "tree", "--locked", "--workspace", "-e", "normal,build",
            "--target", host.group(1) if host else "all", "--prefix", "none"]

    packages = set(run(tree + ["--format", "{p}|{l}"]).splitlines())
    for line in sorted(packages):
        name_ver, _, lic = line.partition("|")
        if "(/" in name_ver or not name_ver.strip():
            continue  # a workspace crate (a path dependency)
        who = name_ver.split(" (")[0].strip()
        lic = lic.removesuffix("(*)").strip()  # "(*)": shown before, deduplicated
        try:
            if not lic:
                problems.append(f"license: {who} declares no license expression")
            elif not license_ok(lic, allowed):
                problems.append(f"license: {who} is {lic!r}, not in deny.toml's allow list")
        except (ValueError, IndexError) as e:
            problems.append(f"license: {who}: {e}")

    dups = set(run(tree + ["-d", "--depth", "0"]).splitlines())
    for line in sorted(dups):
        m = re.match(r"^(\S+) v(\S+)", line)
        if not m or f"{m.group(1)}@{m.group(2)}" in skip:
            continue
        # The copy not named in skip is the one we keep.
        if not any(s.startswith(m.group(1) + "@") for s in skip):
            problems.append(f"duplicate: {m.group(1)} v{m.group(2)} (and another version)")

    for p in problems:
        print(p)
    print(f"check-deps: {len(packages)} packages, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
