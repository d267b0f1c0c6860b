"""Graders: the sandbox that runs programs, the LiveCodeBench grader, the GPQA letter check.

sandbox.run_program     one untrusted Python program, bounded and without network
lcb.grade_code          one program on a problem's tests, lcb_runner's rules
lcb.grade_many          many programs on a bounded thread pool
gpqa.grade_letter       a submitted letter against the correct one
python -m atlas grade lcb --problem ROW.json --code PROG.py   (cli.py)
"""
