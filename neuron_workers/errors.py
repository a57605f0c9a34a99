"""User-facing errors: a mistake by whoever calls us, reported as one clear line, never a traceback."""


class UserError(ValueError):
    """Bad input from a user (path, config, prompt, sampling parameter). `code` names it for APIs."""

    def __init__(self, message: str, code: str = "invalid_request", param: str | None = None):
        super().__init__(message)
        self.code = code
        self.param = param


class ContextLengthError(UserError):
    """The prompt (plus the tokens asked for) does not fit the compiled context."""

    def __init__(self, message: str, param: str | None = "prompt"):
        super().__init__(message, code="context_length_exceeded", param=param)
