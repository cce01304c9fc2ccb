"""Command line: `python -m autograder check PATH [--json]`, `release` and `grade` (a whole class)."""
import argparse
import sys

from autograder.grading import check_notebook
from autograder.release import release


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["grade"]:  # its own parser: python -m autograder grade --help
        from autograder.classroom import main as grade_main
        return grade_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m autograder",
                                     description="Grade and release the course's notebooks.")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="grade one notebook, hidden tests included")
    check.add_argument("path", help="the student's .ipynb")
    check.add_argument("--json", action="store_true", help="print one JSON object (the grading contract)")
    check.add_argument("--assignment", help="the assignment id, when the file name doesn't say it")
    check.add_argument("--timeout", type=int, help="seconds allowed per cell")
    check.add_argument("--sandbox", choices=["required", "preferred", "off"], default="preferred",
                       help="run the kernel in the OS sandbox: preferred (default: unsandboxed, with a "
                            "warning, where the machine cannot), required, or off")
    release_parser = commands.add_parser("release", help="regenerate course/ from solutions/")
    release_parser.add_argument("assignments", nargs="*", help="only these assignments (default: all)")
    commands.add_parser("grade", help="grade a whole class (see: python -m autograder grade --help)")
    args = parser.parse_args(argv)

    if args.command == "release":
        for path in release(only=args.assignments or None):
            print(f"released {path}")
        return 0
    report = check_notebook(args.path, assignment_id=args.assignment, cell_timeout=args.timeout,
                            sandbox_mode=args.sandbox)
    print(report.to_json() if args.json else report.to_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
