"""The data directory's format version: which releases can read what is stored there.

nsqd's ``--data-path`` and nsqlookupd's meta store directory each hold a small file,
``nsqx.format.json`` (``{"format": 1, "written_by": "nsqx 0.1.0"}``), written by temp
file, fsync, rename and an fsync of the directory. A directory without one was written
before formats were recorded, in format 1, which is today's. A daemon opens its
directory with :func:`open_data_dir` before reading anything else there: a format it
reads is used (and recorded if it was not), any other stops the start with one line
that says why and what to run. A release that changes what is on disk raises
:data:`CURRENT`, migrates the formats from :data:`OLDEST_READABLE` up on start, and
names in :data:`MIGRATED_BY` the release whose start migrates each format it no longer
reads.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from nsqx import __version__
from nsqx.store.durable_file import makedirs_durable, write_durable

#: The file in the data directory.
FORMAT_FILE = "nsqx.format.json"
#: The format this release writes.
CURRENT = 1
#: The oldest format this release reads (and migrates to CURRENT on start).
OLDEST_READABLE = 1
#: For each format older than OLDEST_READABLE, the release whose daemon migrates it on
#: start (none yet: every format so far is readable).
MIGRATED_BY: dict[int, str] = {}
#: This release, as the file records it.
RELEASE = f"nsqx {__version__}"


class DataFormatError(ValueError):
    """The directory holds a format this release does not read; the message is one
    line for the operator."""


@dataclass(frozen=True)
class DataFormat:
    """A directory's recorded format and the release that wrote it ("" if unrecorded)."""

    format: int
    written_by: str = ""


def read_format(directory: str) -> DataFormat | None:
    """The directory's recorded format; None if it has no format file. Raises
    DataFormatError if the file cannot be read as one."""
    path = os.path.join(directory, FORMAT_FILE)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(raw)
        fmt = doc["format"]
        written_by = doc.get("written_by", "")
        if not isinstance(fmt, int) or isinstance(fmt, bool) or not isinstance(written_by, str):
            raise TypeError
    except (ValueError, TypeError, KeyError, AttributeError):
        raise DataFormatError(f"{path} is not a data format file (damaged?)") from None
    return DataFormat(fmt, written_by)


def write_format(directory: str, fmt: DataFormat) -> None:
    """Record ``fmt`` atomically and durably (:func:`~nsqx.store.durable_file.write_durable`)."""
    data = json.dumps({"format": fmt.format, "written_by": fmt.written_by}) + "\n"
    write_durable(os.path.join(directory, FORMAT_FILE), data.encode())


def check_format(
    directory: str,
    command: str,
    found: DataFormat,
    oldest: int = OLDEST_READABLE,
    current: int = CURRENT,
) -> None:
    """Raise DataFormatError unless this release reads ``found`` (formats ``oldest`` to
    ``current``). ``command`` is how the directory's daemon is started (``nsqx nsqd``)."""
    v = found.format
    written = f" (written by {found.written_by})" if found.written_by else ""
    reads = f"formats {oldest} to {current}" if oldest < current else f"format {current}"
    if v > current:
        newer = found.written_by or f"a release that reads format {v}"
        raise DataFormatError(
            f"{directory} holds data format {v}{written}; {RELEASE} reads formats up to "
            f"{current} and cannot move a directory back: start it with `{command}` of "
            f"{newer} or later"
        )
    if v < oldest:
        migrator = MIGRATED_BY.get(v)
        if migrator is None:
            raise DataFormatError(
                f"{directory} holds data format {v}{written}, older than {RELEASE} "
                f"reads ({reads}), and no release migrates it"
            )
        raise DataFormatError(
            f"{directory} holds data format {v}{written}, older than {RELEASE} reads "
            f"({reads}): migrate it first with `{command} --data-path={directory}` of "
            f"nsqx {migrator}, which upgrades it on start, then start this release again"
        )


def open_data_dir(directory: str, command: str) -> DataFormat:
    """Check the format of a daemon's data directory (made if missing) before it reads
    anything there, and record its format if none was (format 1, by this release). Raises
    DataFormatError (one line, naming the command to run) if this release cannot read
    it; ``command`` is how the daemon is started (``nsqx nsqd``, ``nsqx nsqlookupd``)."""
    makedirs_durable(directory)
    found = read_format(directory)
    if found is not None:
        check_format(directory, command, found)
        return found
    # new, or written before formats were recorded: format 1, the first
    found = DataFormat(1)
    check_format(directory, command, found)
    write_format(directory, DataFormat(found.format, RELEASE))
    return found
