"""Grades out: a graded class as the CSV files that Canvas's and Moodle's gradebooks import.

    python -m autograder.lms_export --roster roster.csv --class-dir autograder/work/class \\
        --canvas canvas.csv [--canvas-ids 04_self_attention=1234,...] [--moodle moodle.csv]

The grades are `make grade`'s (the class folder's ledger.jsonl: the last grading of each student's
notebook); the roster (autograder/hub/roster.py) says who each student is in the LMS.

- **Canvas** (Grades > Import): the columns of Canvas's own gradebook export, `Student`, `ID`,
  `SIS User ID`, `SIS Login ID`, `Section`, then one column per notebook, then the optional points;
  the row after the header is `Points Possible`. Canvas finds each student by ID, else SIS User ID,
  else SIS Login ID (here the username when the roster gives none of them). A notebook's column is
  headed `Name (id)` when `--canvas-ids` gives the Canvas assignment's id, so the grades go to that
  assignment; else `Name`, and Canvas offers to create the assignment with the points possible.
  Each notebook's column holds its required points out of the notebook's required total; the optional
  stretch points of all notebooks go in one column, "Optional stretch exercises", whose points possible
  are 0, so Canvas counts them as extra credit and no total requires them. A notebook not handed in
  is left blank (Canvas changes nothing there) unless --missing-as-zero.
- **Moodle** (Grades > Import > CSV file): a header row, then one row per student; Moodle's import
  asks which column identifies the user (`Email address`, `Username` or `ID number`, from
  `sis_user_id`) and which grade item each other column goes to. The same grade columns as Canvas.
Entries that grading flagged or scored 0 for an error are listed on stderr: review them first.
"""
import argparse
import contextlib
import csv
import json
import pathlib
import sys

from autograder import grading
from autograder.classroom import LEDGER
from autograder.hub.roster import Member, read_roster

CANVAS_IDENTITY = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
POINTS_POSSIBLE = "Points Possible"
MOODLE_IDENTITY = ["First name", "Last name", "ID number", "Username", "Email address"]
OPTIONAL_COLUMN = "Optional stretch exercises"


def class_grades(class_dir):
    """{(student, assignment): ledger entry} of a graded class folder: its ledger.jsonl, one JSON line
    per grading, the last line of each student's notebook counting (read only: nothing is rewritten)."""
    path = pathlib.Path(class_dir) / LEDGER
    if not path.exists():
        raise SystemExit(f"{class_dir} has no {LEDGER}: grade the class first (make grade GRADE_DIR=...)")
    entries = {}
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line cut short by a kill
            entry = json.loads(line)
            entries[(entry["student"], entry["assignment"])] = entry
    return entries


def grade_table(entries, members, assignments=None, missing_as_zero=False):
    """Rows of (member, {assignment: score or None}, optional points) for the roster's students, then
    anyone graded who is not on it; and the assignments, in course order."""
    assignments = assignments or sorted({assignment for _, assignment in entries})
    students = [m for m in members if m.role == "student"]
    listed = {m.username for m in students}
    students += [Member(name) for name in sorted({s for s, _ in entries} - listed)]
    rows = []
    for member in students:
        scores, optional = {}, 0.0
        for assignment in assignments:
            entry = entries.get((member.username, assignment))
            scores[assignment] = entry["score"] if entry else (0.0 if missing_as_zero else None)
            optional += entry.get("stretch_score", 0.0) if entry else 0.0
        rows.append((member, scores, optional))
    return rows, assignments


def notes(entries, members):
    """Lines for stderr: what a person should look at before the grades go out."""
    listed = {m.username for m in members}
    lines = [f"{s} {a}: {'; '.join(e['errors'] + e['flags'])}" for (s, a), e in sorted(entries.items())
             if e["errors"] or e["flags"]]
    lines += [f"{s}: graded but not on the roster (exported with the username only)"
              for s in sorted({s for s, _ in entries} - listed)]
    return lines


def number(value):
    return "" if value is None else f"{value:g}"


def write_canvas(rows, assignments, path, canvas_ids=None):
    canvas_ids = canvas_ids or {}
    columns = [f"{a} ({canvas_ids[a]})" if a in canvas_ids else a for a in assignments]
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(CANVAS_IDENTITY + columns + [OPTIONAL_COLUMN])
        writer.writerow([POINTS_POSSIBLE, "", "", "", ""] + [number(grading.max_score(a)) for a in assignments]
                        + ["0"])
        for member, scores, optional in rows:
            login = member.sis_login_id or ("" if member.lms_id or member.sis_user_id else member.username)
            writer.writerow([member.name, member.lms_id, member.sis_user_id, login, member.section]
                            + [number(scores[a]) for a in assignments] + [number(optional)])


def write_moodle(rows, assignments, path):
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(MOODLE_IDENTITY + list(assignments) + [OPTIONAL_COLUMN])
        for member, scores, optional in rows:
            writer.writerow([member.first_name, member.last_name, member.sis_user_id, member.username, member.email]
                            + [number(scores[a]) for a in assignments] + [number(optional)])


def parse_ids(text):
    """'04_self_attention=123,09_gpt=456' -> {assignment: Canvas assignment id}."""
    pairs = [p.split("=", 1) for p in (text or "").split(",") if p.strip()]
    if any(len(p) != 2 or not p[1].strip().isdigit() for p in pairs):
        raise SystemExit(f"--canvas-ids takes assignment=number pairs separated by commas, not {text!r}")
    return {a.strip(): i.strip() for a, i in pairs}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m autograder.lms_export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--roster", required=True, help="the class list (CSV, autograder/hub/roster.py)")
    parser.add_argument("--class-dir", required=True, help="the folder `make grade` graded into (GRADE_DIR)")
    parser.add_argument("--canvas", help="write Canvas's gradebook import CSV here")
    parser.add_argument("--canvas-ids", help="Canvas assignment ids: 04_self_attention=1234,09_gpt=1240")
    parser.add_argument("--moodle", help="write Moodle's grade import CSV here")
    parser.add_argument("--assignments", nargs="*", help="only these notebooks (default: all that were graded)")
    parser.add_argument("--missing-as-zero", action="store_true", help="0 for a notebook not handed in")
    args = parser.parse_args(argv)
    if not args.canvas and not args.moodle:
        parser.error("say where to write: --canvas FILE and/or --moodle FILE")
    members = read_roster(args.roster, need_instructor=False)
    entries = class_grades(args.class_dir)
    rows, assignments = grade_table(entries, members, args.assignments, args.missing_as_zero)
    if args.canvas:
        write_canvas(rows, assignments, args.canvas, parse_ids(args.canvas_ids))
        print(f"Canvas: {args.canvas} ({len(rows)} students, {len(assignments)} notebooks)")
    if args.moodle:
        write_moodle(rows, assignments, args.moodle)
        print(f"Moodle: {args.moodle} ({len(rows)} students, {len(assignments)} notebooks)")
    for line in notes(entries, members):
        print(f"review: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
