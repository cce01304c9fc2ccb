"""Grades out: Canvas's gradebook import CSV and Moodle's grade import CSV from a graded class.

Canvas's import reads the layout of its own gradebook export: the columns Student, ID, SIS User ID,
SIS Login ID, Section, then one column per assignment headed "Name (id)" (a name alone: a new
assignment), and a "Points Possible" row under the header. A class folder is made here the way
`make grade` leaves it (ledger.jsonl, one JSON line per grading), with a roster.
"""
import csv
import json

import pytest

from autograder import grading, lms_export
from autograder.classroom import LEDGER
from autograder.hub.roster import RosterError, read_roster

ROSTER = """\
username,role,first_name,last_name,email,section,sis_user_id,sis_login_id,lms_id
ada,student,Ada,Lovelace,ada@example.org,Section A,S1001,ada.lovelace,501
ben,student,Ben,Okafor,ben@example.org,Section B,S1002,,
cleo,student,,,,,,,
prof,instructor,Grace,Hopper,,,,,
"""


def entry(student, assignment, score, stretch=0.0, errors=(), flags=()):
    return {"student": student, "assignment": assignment, "digest": "d", "score": score,
            "max_score": grading.max_score(assignment), "stretch_score": stretch, "seconds": 1.0,
            "errors": list(errors), "flags": list(flags), "worker": "w"}


@pytest.fixture
def graded_class(tmp_path):
    """A class folder as `make grade` leaves it: ada did 04 and 09 (with stretch points), ben 04 only
    and was regraded (the ledger's last line counts), cleo nothing, zoe is graded but not on the roster."""
    graded = [entry("ada", "04_self_attention", 14, stretch=3), entry("ada", "09_gpt", 30, stretch=1),
              entry("ben", "04_self_attention", 2), entry("ben", "04_self_attention", 10),
              entry("zoe", "09_gpt", 0, errors=["09_gpt.ipynb is unreadable: scored 0"])]
    (tmp_path / "class").mkdir()
    (tmp_path / "class" / LEDGER).write_text("".join(json.dumps(e) + "\n" for e in graded) + '{"cut short')
    roster = tmp_path / "roster.csv"
    roster.write_text(ROSTER)
    return tmp_path / "class", roster


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.reader(handle))


def test_canvas_gradebook_import_columns(graded_class, tmp_path):
    class_dir, roster = graded_class
    out = tmp_path / "canvas.csv"
    assert lms_export.main(["--roster", str(roster), "--class-dir", str(class_dir), "--canvas", str(out)]) == 0
    header, points, *rows = read_csv(out)
    assert header == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "04_self_attention", "09_gpt",
                      "Optional stretch exercises"], "Canvas's identity columns, one per notebook, the optional points"
    assert points == ["Points Possible", "", "", "", "", f"{grading.max_score('04_self_attention'):g}",
                      f"{grading.max_score('09_gpt'):g}", "0"], (
        "the Points Possible row gives each notebook's required total, and 0 for the optional points "
        "(Canvas counts points on a 0-point assignment as extra credit)")
    by_name = {row[0]: row for row in rows}
    assert by_name["Lovelace, Ada"] == ["Lovelace, Ada", "501", "S1001", "ada.lovelace", "Section A", "14", "30", "4"]
    assert by_name["Okafor, Ben"] == ["Okafor, Ben", "", "S1002", "", "Section B", "10", "", "0"], (
        "ben's regrade counts; a notebook not handed in is blank, so Canvas leaves that grade alone")
    assert by_name["cleo"] == ["cleo", "", "", "cleo", "", "", "", "0"], (
        "a student the roster gives no LMS identity is matched by SIS Login ID = username")
    assert by_name["zoe"][3] == "zoe" and by_name["zoe"][6] == "0", "graded but not on the roster: still exported"
    assert "Hopper, Grace" not in by_name, "instructors are not graded"
    assert [row[0] for row in rows] == ["Lovelace, Ada", "Okafor, Ben", "cleo", "zoe"], "roster order, then the rest"


def test_canvas_assignment_ids_and_missing_as_zero(graded_class, tmp_path):
    class_dir, roster = graded_class
    out = tmp_path / "canvas.csv"
    lms_export.main(["--roster", str(roster), "--class-dir", str(class_dir), "--canvas", str(out),
                     "--canvas-ids", "04_self_attention=1234", "--missing-as-zero", "--assignments", "04_self_attention"])
    header, points, *rows = read_csv(out)
    assert header[5:] == ["04_self_attention (1234)", "Optional stretch exercises"], (
        "a notebook with a Canvas id is headed 'Name (id)', Canvas's way of naming an existing assignment")
    assert {row[0]: row[5] for row in rows}["cleo"] == "0"
    with pytest.raises(SystemExit, match="assignment=number"):
        lms_export.parse_ids("04_self_attention:1234")


def test_moodle_grade_import(graded_class, tmp_path):
    class_dir, roster = graded_class
    out = tmp_path / "moodle.csv"
    lms_export.main(["--roster", str(roster), "--class-dir", str(class_dir), "--moodle", str(out)])
    header, *rows = read_csv(out)
    assert header == ["First name", "Last name", "ID number", "Username", "Email address", "04_self_attention",
                      "09_gpt", "Optional stretch exercises"]
    assert rows[0] == ["Ada", "Lovelace", "S1001", "ada", "ada@example.org", "14", "30", "4"]


def test_review_notes_go_to_stderr(graded_class, tmp_path, capsys):
    class_dir, roster = graded_class
    lms_export.main(["--roster", str(roster), "--class-dir", str(class_dir), "--canvas", str(tmp_path / "c.csv")])
    err = capsys.readouterr().err
    assert "review: zoe 09_gpt: 09_gpt.ipynb is unreadable" in err
    assert "review: zoe: graded but not on the roster" in err


def test_ungraded_class_is_refused(tmp_path):
    roster = tmp_path / "roster.csv"
    roster.write_text(ROSTER)
    with pytest.raises(SystemExit, match="grade the class first"):
        lms_export.main(["--roster", str(roster), "--class-dir", str(tmp_path), "--canvas", str(tmp_path / "c.csv")])


@pytest.mark.parametrize("text, message", [
    ("name\nada\n", "at least 'username'"),
    ("username,role\nAda Lovelace,student\nprof,instructor\n", "not a valid username"),
    ("username,role\nada,teacher\n", "neither 'student' nor 'instructor'"),
    ("username,role\nada,student\nada,student\nprof,instructor\n", "listed twice"),
    ("username,role\nada,student\n", "no instructor"),
])
def test_roster_errors_name_the_line(tmp_path, text, message):
    path = tmp_path / "roster.csv"
    path.write_text(text)
    with pytest.raises(RosterError, match=message):
        read_roster(path)


def test_roster_from_excel(tmp_path):
    path = tmp_path / "roster.csv"
    path.write_bytes("\ufeffusername , role\n ada , student\n\nprof,instructor\n".encode())
    members = read_roster(path)
    assert [(m.username, m.role) for m in members] == [("ada", "student"), ("prof", "instructor")]
