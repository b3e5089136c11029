"""The one error hierarchy of trtspec: every user-facing failure is a TrtspecError with a one-line message."""


class TrtspecError(Exception):
    """A failure caused by the user's input or environment; the CLI prints it as one line and exits 1."""


class ConfigError(TrtspecError):
    """A configuration value or flag combination is invalid."""


class CheckpointError(TrtspecError):
    """A checkpoint on disk is missing, malformed, or inconsistent with another."""


class BuildError(TrtspecError):
    """An engine cannot be built from the given checkpoint and profile."""


class RuntimeEngineError(TrtspecError):
    """The engine runtime failed to serve a request."""


class RepositoryError(TrtspecError):
    """A Triton model repository cannot be written or is inconsistent."""


class ServerError(TrtspecError):
    """The Triton server cannot be found, started or reached."""
