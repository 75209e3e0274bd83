"""One error type for bad user input: it names the field and the fix.

Not a ValueError on purpose: pydantic would wrap a ValueError raised in a validator, and we want
the field and fix to reach the user as written.
"""


class PlanError(Exception):
    """Bad input to sp-plan; the message names the field and how to fix it (CLI exits 2)."""

    def __init__(self, field: str, problem: str, fix: str):
        self.field, self.problem, self.fix = field, problem, fix
        super().__init__(f"{field}: {problem}; {fix}")
