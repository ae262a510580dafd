"""Errors that reach the user as one line and exit status 2."""


class HpcdlError(Exception):
    """Base class: the message is one line naming the key or file and how to fix it."""


class ConfigError(HpcdlError):
    """A config key has an unknown name, a wrong type or a bad value."""


class DataError(HpcdlError):
    """A data file is missing, unreadable or does not hold what the config says."""


class CheckpointError(HpcdlError):
    """A checkpoint is missing, corrupt, or does not match the model."""


class RunDirError(HpcdlError):
    """A run directory collides with an existing one or is not a run directory."""
