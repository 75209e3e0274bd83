"""One error type for bad user input: it names the field and the fix."""


class PlanError(ValueError):
    """Bad input to sp-plan; the message names the field and how to fix it (CLI exits 2)."""

    def __init__(self, field: str, problem: str, fix: str):
        self.field, self.problem, self.fix = field, problem, fix
        super().__init__(f"{field}: {problem}; {fix}")
