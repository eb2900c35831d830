"""Under ``fxplan launch`` the torchrun agent's warnings are dropped once a worker has reported
its error (the launcher prints it, once): the agent's own loggers and the process context
that terminates the other workers."""

from __future__ import annotations

import logging

import pytest

from fxplan.runtime.launch.rank_errors import report_error
from fxplan.runtime.launch.torchrun import quiet_torch_logs


@pytest.mark.parametrize("name", ["torch.multiprocessing.spawn",
                                  "torch.distributed.elastic.agent.server.api"])
def test_warnings_go_once_a_worker_reported(tmp_path, name) -> None:
    logger = logging.getLogger(name)
    before = list(logger.filters)
    logger.filters[:] = []   # another test in this process may have left its launch's filter
    try:
        quiet_torch_logs(str(tmp_path))
        record = logger.makeRecord(name, logging.WARNING, __file__, 1,
                                   "Terminating process %s via signal SIGTERM", (7,), None)
        assert logger.filter(record)           # nothing reported yet: the warning shows
        assert report_error(0, ValueError("bad input"), str(tmp_path))
        assert not logger.filter(record)       # the launcher's paragraph says it
        debug = logger.makeRecord(name, logging.INFO, __file__, 1, "kept", (), None)
        assert logger.filter(debug)
    finally:
        logger.filters[:] = before
