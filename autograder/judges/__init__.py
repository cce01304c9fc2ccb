"""The grader's half of the hidden checks: oracles, references, diagnoses and judges, one module per topic.

`autograder/checks/<topic>.py` holds the probes (what runs in the student's kernel: seeded inputs, calls
into the student's code, data back) and the inputs both sides rebuild from the seeds. The judges in
`autograder/judges/<topic>.py` register themselves on those probes (`@<check>.judge`) and decide. This
package is never mounted in the grading sandbox (autograder/sandbox.py), so a notebook cannot import an
oracle or a judge from it; the grader imports it when it resolves a check (`checks.common.resolve`).
"""
