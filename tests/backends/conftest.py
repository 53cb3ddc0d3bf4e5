from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections.abc import Iterator

import pytest

from pollux.backends.processes import marked_processes, signal_group


@pytest.fixture
def instance_id() -> Iterator[str]:
    """A backend instance id; every process carrying it is killed after the test."""
    value = f"test-{uuid.uuid4().hex}"
    yield value
    from pollux.backends.local import MARKER_ENV
    for pid in marked_processes(MARKER_ENV, value):
        signal_group(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
