"""Print the pip requirements listed in environment.yml, one per line (stdlib only).

The Makefile feeds this to `pip install -r /dev/stdin`, so environment.yml stays the one list.
"""
import pathlib
import sys

ENVIRONMENT_YML = pathlib.Path(__file__).resolve().parent.parent / "environment.yml"


def pip_requirements(text):
    lines, in_pip = [], False
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if line.strip() == "- pip:":
            in_pip = True
        elif in_pip and line.strip().startswith("- "):
            requirement = line.strip()[2:].strip()
            if not requirement.startswith("--"):  # index options are for conda's online installs
                lines.append(requirement)
        elif in_pip and line.strip():
            break
    return lines


if __name__ == "__main__":
    requirements = pip_requirements(ENVIRONMENT_YML.read_text())
    if not requirements:
        sys.exit(f"no pip requirements found in {ENVIRONMENT_YML}")
    print("\n".join(requirements))
