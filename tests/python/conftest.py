"""hvdrun starts one pytest per rank and every rank runs the same session: the tests are
collective, so each rank must collect and run the same tests in the same order (no -k or -x on
one rank only). hvd.torch is initialized once for the session; a test that shuts it down
initializes it again."""
import sys

import pytest
import torch

import hvd.torch as hvd

torch.set_num_threads(1)
hvd.init()


def pytest_report_header(config):
    return "hvd.torch: rank %d of %d, backend %s, torch %s" % (hvd.rank(), hvd.size(),
                                                                 hvd.backend(), torch.__version__)


class WholeLines:
    """Passes text on a line at a time: mpiexec tags each piece a rank writes with the rank, so
    the progress dots of ranks that print at once would interleave mid-line. Not a terminal, so
    pytest writes no colour codes either (mpiexec gives a rank a pseudo-terminal)."""

    def __init__(self, out):
        self.out = out
        self.pending = ""

    def write(self, text):
        lines, newline, self.pending = (self.pending + text).rpartition("\n")
        if newline:
            self.out.write(lines + newline)
            self.out.flush()
        return len(text)

    def flush(self):
        pass

    def isatty(self):
        return False

    def close(self):
        self.out.write(self.pending)
        self.out.flush()
        self.pending = ""


report = None


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    # The terminal reporter takes sys.stdout in its own pytest_configure, after this one.
    global report
    report = WholeLines(sys.stdout)
    sys.stdout = report


def pytest_sessionstart(session):
    sys.stdout = report.out


@pytest.fixture(autouse=True)
def in_step():
    """Every test starts and ends with hvd initialized and the ranks in step."""
    if not hvd.is_initialized():
        hvd.init()
    yield
    if not hvd.is_initialized():
        hvd.init()
    hvd.barrier()


def pytest_unconfigure(config):
    # hvdrun stops every rank once one exits with a failure: wait until every rank has printed
    # its report.
    if report is not None:
        report.close()
    if hvd.is_initialized():
        try:
            hvd.barrier()
        except Exception:
            pass
