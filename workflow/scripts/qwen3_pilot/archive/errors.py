"""What the archive and its S3 destination share (a module of its own, so that neither imports the other)."""

KEY = "archive"  # the config block; errors name its keys as archive.<key>


class ArchiveError(RuntimeError):
    pass
