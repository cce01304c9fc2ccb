"""The class list: one CSV for the hub's accounts and for the grades sent to the LMS.

Columns (a header row; only `username` is required, the others may be left out or empty):
- `username`: the login and the system user, e.g. `ada` (lowercase letters, digits, `_`, `-`);
- `role`: `student` (the default) or `instructor`;
- `first_name`, `last_name`, `email`: for nbgrader's gradebook and the LMS files;
- `section`, `sis_user_id`, `sis_login_id`, `lms_id`: how the LMS knows the student (Canvas's
  Section, SIS User ID, SIS Login ID and ID; Moodle's ID number is the SIS User ID).
"""
import csv
import dataclasses
import pathlib
import re

ROLES = ("student", "instructor")
USERNAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")  # what useradd accepts everywhere (NAME_REGEX)
COLUMNS = ("username", "role", "first_name", "last_name", "email", "section", "sis_user_id",
           "sis_login_id", "lms_id")


@dataclasses.dataclass(frozen=True)
class Member:
    username: str
    role: str = "student"
    first_name: str = ""
    last_name: str = ""
    email: str = ""
    section: str = ""
    sis_user_id: str = ""
    sis_login_id: str = ""
    lms_id: str = ""

    @property
    def name(self):
        """As an LMS shows it: "Last, First" (Canvas's Student column), else the username."""
        return ", ".join(p for p in (self.last_name, self.first_name) if p) or self.username


class RosterError(ValueError):
    """A roster that cannot be used, with the line that says why."""


def read_roster(path, need_instructor=True):
    """The members listed in the CSV at `path`, in its order (a hub needs an instructor)."""
    path = pathlib.Path(path)
    with open(path, newline="", encoding="utf-8-sig") as handle:  # Excel writes a byte-order mark
        reader = csv.DictReader(handle)
        if not reader.fieldnames or "username" not in [f.strip() for f in reader.fieldnames]:
            raise RosterError(f"{path}: the first line must name the columns, with at least 'username' "
                              f"(known columns: {', '.join(COLUMNS)})")
        members, seen = [], set()
        for line, row in enumerate(reader, start=2):
            row = {(k or "").strip(): (v or "").strip() for k, v in row.items()}
            if not any(row.values()):
                continue
            values = {k: row[k] for k in COLUMNS if row.get(k)}
            member = Member(**values)
            if not USERNAME.match(member.username):
                raise RosterError(f"{path}:{line}: {member.username!r} is not a valid username (lowercase "
                                  "letters, digits, '_' and '-', starting with a letter or '_', at most 32)")
            if member.role not in ROLES:
                raise RosterError(f"{path}:{line}: role {member.role!r} is neither 'student' nor 'instructor'")
            if member.username in seen:
                raise RosterError(f"{path}:{line}: {member.username} is listed twice")
            seen.add(member.username)
            members.append(member)
    if need_instructor and not any(m.role == "instructor" for m in members):
        raise RosterError(f"{path}: no instructor listed (role 'instructor'): someone must release and grade")
    return members


def write_roster(members, path):
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(dataclasses.asdict(m) for m in members)
